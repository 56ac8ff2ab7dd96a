"""Every table the CLI prints fits an 80-column terminal without cutting a value short: names (a
stack, an alias, an endpoint, a host) stay whole on one line, other values fold onto more lines,
nothing ends in an ellipsis; `-o wide` adds the columns left out by default."""

from __future__ import annotations

import pytest

from sparkctl.cli import bench, fleet, images, route, views
from sparkctl.cli.console import Output, out, table
from sparkctl.messages import Status, StatusRow
from sparkctl.state.store import Store

LONG_STACK = "qwen36-bf16-dflash-n1-with-a-longer-name"
IMAGE = "ghcr.io/aeon-7/aeon-vllm-ultimate:2026-06-18-v0.23.0-dflashfix"
DIGEST = "sha256:" + "ab" * 32
WORDS = "the engine crashed above 16 concurrent requests; use v2 (seed 003:31)"


def rendered(made) -> str:
    console = out()
    with console.capture() as captured:
        console.print(made)
    return captured.get()


def whole(value: str, text: str) -> bool:
    return any(value in line for line in text.splitlines())


# Each table: its columns, a row of long values, and the values that are names.
TABLES = {
    "stacks list": (views.STACKS, (LONG_STACK, "vllm", IMAGE, "AEON-7/Qwen3.6-27B-AEON-Ultimate-Uncensored-BF16@main",
                                   "Hikari07jp/DSpark-Qwen3.6-27B-AEON-draft@main", "0.80", "8109", WORDS,
                                   "owner, over shipped"),
                    [LONG_STACK]),
    "status": (views.STATUS, (LONG_STACK, "starting", "http://127.0.0.1:28109/v1", "0123456789ab", "1h02m", "0.80"),
               [LONG_STACK, "http://127.0.0.1:28109/v1"]),
    "image list pins": (images.PINS, (IMAGE, DIGEST, "not yet: first seen 2026-06-01, until a benchmark passes",
                                      WORDS, "2026-06-01", "state, over shipped"), []),
    "image list blacklist": (images.BANS, (IMAGE, WORDS, "2026-06-10", f"2026-06-12 {DIGEST[:19]}: fail (1 in all)",
                                           "state, over owner"), []),
    "image list sleep mode": (images.WAKES, (DIGEST, "no: parks by stopping", WORDS, "2026-06-10", "state"), []),
    "bench list": (bench.RUNS, ("12", LONG_STACK, "concurrency", "0123456789ab", "54.3", "fail: " + WORDS),
                   [LONG_STACK]),
    "route show": (route.ROUTES, ("primary-long-alias", "0", "<= 8192", LONG_STACK),
                   ["primary-long-alias", LONG_STACK]),
    "fleet status": (fleet.HOSTS, ("spark-two", "alive", "10.77.0.2:6379", "121.7 GiB (ceiling 0.9)",
                                   "CPU=20 spark:spark-two=1", "0a1b2c3d", WORDS), ["spark-two", "10.77.0.2:6379"]),
    "fleet ps": (fleet.CONTAINERS, ("spark-two", LONG_STACK, f"sparkctl-test-0a1b2c3d-{LONG_STACK}", "running", IMAGE,
                                    DIGEST[:19]), ["spark-two", LONG_STACK]),
}


@pytest.mark.parametrize("name", TABLES)
@pytest.mark.parametrize("output", [None, Output.WIDE])
def test_a_table_at_80_columns_cuts_no_value_and_keeps_names_whole(name, output, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    columns, row, names = TABLES[name]
    text = rendered(table(columns, [row, row], output=output))
    assert "…" not in text and max(len(line) for line in text.splitlines()) <= 80, text
    assert all(whole(value, text) for value in names), text


@pytest.mark.parametrize("name", TABLES)
def test_wide_adds_the_columns_left_out_by_default(name, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "400")
    columns, row, _ = TABLES[name]
    extra = [column.header for column in columns if column.wide]
    narrow, wide = (rendered(table(columns, [row], output=output)) for output in (None, Output.WIDE))
    assert extra and all(header in wide and header not in narrow for header in extra), (narrow, wide)


def test_status_prints_names_and_endpoints_whole_and_the_fingerprint_with_wide(monkeypatch, capsys) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    rows = tuple(StatusRow(stack=stack, phase="starting", state="running", endpoint=f"http://127.0.0.1:2810{i}/v1",
                           fingerprint="0123456789abcdef", container=f"sparkctl-{stack}", uptime_s=3725, memory=0.8,
                           error=None, kv=None) for i, stack in enumerate(["qwen36-bf16-dflash-n1", "diffusiongemma"]))
    views.status(Status(stacks=rows, others={}), as_json=False, output=None)
    text = capsys.readouterr().out
    assert "…" not in text and "0123456789ab" not in text, text
    assert all(whole(row.stack, text) and whole(row.endpoint, text) for row in rows), text
    monkeypatch.setenv("COLUMNS", "200")
    views.status(Status(stacks=rows, others={}), as_json=False, output=Output.WIDE)
    assert "0123456789ab" in capsys.readouterr().out


def test_image_and_bench_lists_through_the_cli(workspace, cli, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    Store(workspace / "state" / "sparkctl.db").bench.begin(LONG_STACK, "0123456789abcdef", {}, "concurrency")
    for args in (("image", "list"), ("bench", "list")):
        code, text, err = cli(*args)
        assert code == 0 and "…" not in text, err + text
    assert whole(LONG_STACK, text) and "0123456789ab" not in text
    monkeypatch.setenv("COLUMNS", "200")
    code, text, _ = cli("bench", "list", "-o", "wide")
    assert code == 0 and "0123456789ab" in text and whole(LONG_STACK, text)
    code, text, _ = cli("image", "list", "--output", "wide")
    assert code == 0 and "provenance" in text and "…" not in text
