"""The systemd unit `sparkctl service` writes, and the desired-state file."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from sparkctl.errors import SpecError
from sparkctl.state import desired
from sparkctl.state.desired import Desired


def test_service_install_and_uninstall_a_user_unit(workspace: Path, cli, monkeypatch) -> None:
    monkeypatch.setenv("XDG_CONFIG_HOME", str(workspace / "config"))
    monkeypatch.setenv("SPARKCTL_GATEWAY_PORT", "8000")
    code, out, _ = cli("service", "install", "--user")
    name = f"sparkctl-{os.environ['SPARKCTL_INSTANCE']}"  # the default instance's is plain `sparkctl`
    unit = workspace / "config" / "systemd" / "user" / f"{name}.service"
    assert code == 0 and str(unit) in out and f"systemctl --user enable --now {name}.socket {name}.service" in out
    text = unit.read_text()
    assert " daemon\n" in text and f"SPARKCTL_STATE_DIR={workspace / 'state'}" in text
    assert f"SPARKCTL_INSTANCE={os.environ['SPARKCTL_INSTANCE']}" in text and f"Requires={name}.socket" in text
    assert "KillMode=process" in text and "WantedBy=default.target" in text
    assert "ListenStream=127.0.0.1:8000" in unit.with_suffix(".socket").read_text()
    assert cli("service", "uninstall", "--user")[0] == 0 and not unit.exists()
    assert not unit.with_suffix(".socket").exists()
    code, _, err = cli("service", "uninstall", "--user")
    assert code == 1 and "no unit at" in err


def test_desired_state_round_trips_and_rejects_junk(tmp_path: Path) -> None:
    path = tmp_path / "desired.yaml"
    assert desired.load(path) == Desired()
    wanted = Desired(("a", "b"), {"primary": "a"}, {"primary": "b"})
    desired.save(path, wanted)
    assert desired.load(path) == wanted
    assert desired.load(path).with_stack("a") == wanted and desired.load(path).without_stack("a").stacks == ("b",)
    assert not list(tmp_path.glob("*.tmp"))
    path.write_text("stacks: [a]\nstakcs: [b]\n")
    with pytest.raises(SpecError, match="desired.yaml"):
        desired.load(path)
