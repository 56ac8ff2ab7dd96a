"""Stack files the YAML reader cannot build, dropped into a running daemon's stacks dir: each is
left out naming itself, and every command goes on answering, `status` and `down` included. The
audit's case: a date like `2026-13-45` or an integer of 4,301 digits made every daemon command
answer 500, because value errors from the reader escaped the per-file isolation schema errors had.
A unit test proves the loader; this one proves the daemon's commands over its socket, with a real
engine to take down."""

from __future__ import annotations

from pathlib import Path

from tests.integration.conftest import containers, wait_for

HOSTILE = {
    "bad-date.yaml": "name: bad-date\nextends: qwen36-base\nabstract: false\nvllm: {port: 8031, max_model_len: "
                     "2026-13-45}\n",
    "huge-int.yaml": "name: huge-int\nextends: qwen36-base\nabstract: false\nvllm: {port: 8032, max_model_len: "
                     + "9" * 4_301 + "}\n",
    "itself.yaml": "name: itself\nextends: qwen36-base\nrequest_defaults: {x: &a [*a]}\n",
    "laughs.yaml": "name: laughs\nextends: qwen36-base\nabstract: false\nvllm: {port: 8033}\nrequest_defaults: "
                   f"{{x: [&s {'a' * 16_000}, {', '.join(['*s'] * 4_000)}]}}\n",
}


def test_hostile_stack_files_leave_every_daemon_command_working(start_daemon, world: Path, cli, engine) -> None:
    daemon = start_daemon()
    code, out, err = cli("up", "qwen36-dflash")
    assert code == 0, err
    for name, text in HOSTILE.items():
        (world / "stacks" / name).write_text(text)

    rows = daemon.client.get("/v1/status")["stacks"]
    assert [(r["stack"], r["phase"]) for r in rows] == [("qwen36-dflash", "running")], rows
    listed = {row["stack"]: row["invalid"] for row in daemon.client.get("/v1/stacks")["stacks"]}
    assert listed["qwen36-dflash"] is None
    assert listed["bad-date"].startswith("bad-date.yaml: line 4: vllm.max_model_len: Input should be a valid integer")
    assert listed["huge-int"].startswith("huge-int.yaml: line 4: invalid YAML: '999999999999999999999999…': a "
                                         "number of 4,301 characters")
    assert listed["itself"] == "itself.yaml: holds itself through a YAML alias; write the values out instead"
    assert listed["laughs"].startswith("laughs.yaml: expands to over 1 MiB of text through YAML aliases")
    code, out, err = cli("status")
    assert code == 0 and "qwen36-dflash" in out, err
    code, _, err = cli("stacks", "show", "huge-int")
    assert code == 1 and f"error: {world / 'stacks' / 'huge-int.yaml'}: line 4: invalid YAML: " in err, err

    outcome = list(daemon.client.stream("/v1/down", {"stack": "qwen36-dflash"}))[-1]
    assert outcome["ok"], outcome.get("error")
    wait_for(lambda: not containers(engine, "qwen36-dflash"), timeout=30, what="the stack's container removed")
    assert daemon.client.get("/v1/desired")["stacks"] == []
