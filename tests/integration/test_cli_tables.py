"""`sparkctl stacks list` through the daemon a command starts, in an 80-column terminal: every
stack's name whole on its line, no value cut short with an ellipsis; `-o wide` adds the columns
left out (tests/unit/test_tables.py covers each table's rendering)."""

from __future__ import annotations

from sparkctl.cli.client import DaemonClient


def test_stacks_list_fits_80_columns_and_wide_shows_every_column(workspace, cli, engine, monkeypatch) -> None:
    monkeypatch.setenv("COLUMNS", "80")
    code, text, err = cli("stacks", "list")
    names = [row["stack"] for row in DaemonClient(workspace / "state" / "sparkctl.sock").get("/v1/stacks")["stacks"]]
    lines = text.splitlines()
    assert code == 0 and "…" not in text and max(map(len, lines)) <= 80, err + text
    assert all(any(f"│ {name} " in line for line in lines) for name in names), text
    assert "model" not in text and "port" not in text
    monkeypatch.setenv("COLUMNS", "400")
    code, text, _ = cli("stacks", "list", "-o", "wide")
    assert code == 0 and all(header in text for header in ("kind", "model", "draft", "mem", "port")), text
