"""Every message that names a settings variable names one a user can set: the CLI's line for an
invalid setting (the alias the user set, never `SPARKCTL_` twice), `config show`'s table, and
each `SPARKCTL_*` name written into sparkctl's messages. No message repeats a token."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from sparkctl.settings import Settings, env_names

SRC = Path(__file__).resolve().parents[2] / "src" / "sparkctl"
BAD = "zq9 \x01bad"  # not a number, a bool, a choice, a pair list, a pattern or a token
FIELDS = sorted(Settings.model_fields)
EVERY_NAME = {name for field in FIELDS for name in env_names(field)}
TOKEN = "hf_abcdefghij klmnop"


def _setting_variables() -> list[tuple[str, str]]:
    return [(field, name) for field in FIELDS for name in env_names(field)]


@pytest.mark.parametrize(("field", "name"), _setting_variables(), ids=[n for _, n in _setting_variables()])
def test_every_variable_a_setting_names_is_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, field: str,
                                                 name: str) -> None:
    """A name `env_names` gives is one the settings really read: set it alone to a bad value and
    the message names it, exactly; a setting that takes any string takes it."""
    from pydantic import ValidationError

    from sparkctl.settings import invalid

    monkeypatch.chdir(tmp_path)  # no .env
    for other in EVERY_NAME | {"HF_TOKEN", "HF_ENDPOINT"}:
        monkeypatch.delenv(other, raising=False)
    default = getattr(Settings(), field)
    monkeypatch.setenv(name, BAD)
    try:
        settings = Settings()
    except ValidationError as e:
        message = invalid(e, {name: BAD})
        assert message.startswith(f"setting {name} is invalid: "), message
        assert BAD not in message and "zq9" not in message
        return
    assert getattr(settings, field) != default  # any string goes, and this one was read


def test_the_names_are_the_prefixed_field_or_its_aliases() -> None:
    assert env_names("hf_token") == ("SPARKCTL_HF_TOKEN", "HF_TOKEN")
    assert env_names("gateway_port") == ("SPARKCTL_GATEWAY_PORT",)
    assert not [n for n in EVERY_NAME if n.startswith("SPARKCTL_SPARKCTL_")]


@pytest.mark.parametrize("name", ["SPARKCTL_HF_TOKEN", "HF_TOKEN"])
def test_a_bad_token_names_the_variable_set_and_never_the_token(workspace: Path, cli, monkeypatch, name: str) -> None:
    monkeypatch.setenv(name, TOKEN)
    code, out, err = cli("stacks", "show", "qwen36-dflash")
    assert code == 1 and err.startswith(f"error: setting {name} is invalid: holds whitespace"), err
    assert "SPARKCTL_SPARKCTL" not in err and "abcdefghij" not in out + err and "klmnop" not in out + err


def test_config_show_names_every_variable_a_setting_reads(workspace: Path, cli) -> None:
    code, out, _ = cli("config", "show")
    assert code == 0 and "SPARKCTL_HF_TOKEN or" in out and "SPARKCTL_SPARKCTL" not in out


def test_every_sparkctl_variable_a_message_names_is_real() -> None:
    """Each `SPARKCTL_*` written in sparkctl's code is a setting's variable, or one the code reads
    from the environment itself (the simulated engine's knobs)."""
    text = {path: path.read_text() for path in SRC.rglob("*.py")}
    reads = re.compile(r"environ(?:\.get\(|\[)\s*\"(SPARKCTL_\w+)\"")
    read_directly = {m for body in text.values() for m in reads.findall(body)}
    named = {(m, path.relative_to(SRC).as_posix()) for path, body in text.items()
             for m in re.findall(r"SPARKCTL_[A-Z0-9_]*[A-Z0-9]", body)}
    unknown = sorted((m, where) for m, where in named if m not in EVERY_NAME | read_directly)
    assert unknown == []
    assert {"SPARKCTL_SIM_FAULTS", "SPARKCTL_SIM_TIME_SCALE"} <= read_directly
