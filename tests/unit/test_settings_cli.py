"""Settings parsing, `config show`, and the CLI's single error boundary."""

from __future__ import annotations

import pytest

from sparkctl.settings import Settings


def test_mirror_map_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKCTL_REGISTRY_MIRRORS", "ghcr.io=127.0.0.1:5001, docker.io=127.0.0.1:5002")
    assert Settings().registry_mirrors == {"ghcr.io": "127.0.0.1:5001", "docker.io": "127.0.0.1:5002"}


def test_defaults_listen_on_loopback(monkeypatch: pytest.MonkeyPatch, tmp_path) -> None:
    monkeypatch.chdir(tmp_path)
    s = Settings()
    assert (s.gateway_host, s.gateway_port, s.memory_ceiling) == ("127.0.0.1", 8000, 0.90)


def test_config_show_masks_the_token(workspace, cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKCTL_HF_TOKEN", "hf_abcdefghijklmnop")
    code, out, err = cli("config", "show", "--json")
    assert code == 0 and "hf_abcdefghijklmnop" not in out + err
    assert '"hf_token": "**********"' in out


def test_bad_setting_is_one_line(workspace, cli, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKCTL_MEMORY_CEILING", "2")
    code, out, err = cli("stacks", "list")
    assert code == 1 and err.count("\n") == 1
    assert "SPARKCTL_MEMORY_CEILING is invalid" in err


def test_error_boundary_traceback_only_with_debug(workspace, cli) -> None:
    code, _, err = cli("stacks", "show", "no-such")
    assert code == 1 and "Traceback" not in err and "no such stack; known stacks: aeon-gemma4-v2" in err
    code, _, err = cli("--debug", "stacks", "show", "no-such")
    assert code == 1 and "Traceback" in err


def test_unexpected_bug_is_still_one_line(workspace, cli, monkeypatch: pytest.MonkeyPatch) -> None:
    from sparkctl.spec import render

    monkeypatch.setattr(render, "spec_hash", lambda _: 1 / 0)
    code, _, err = cli("stacks", "show", "qwen36-dflash")
    assert code == 1 and err.strip().splitlines() == [
        "internal error: ZeroDivisionError: division by zero (rerun with --debug for the traceback)"]


def test_usage_errors_exit_2(workspace, cli) -> None:
    code, _, err = cli("stacks", "render", "qwen36-dflash", "--format", "yaml")
    assert code == 2 and "docker-run" in err


@pytest.mark.parametrize("fmt", ["docker-run", "json", "compose"])
def test_render_formats(workspace, cli, fmt: str) -> None:
    code, out, _ = cli("stacks", "render", "qwen36-dflash", "--format", fmt)
    assert code == 0 and "--speculative-config" in out and "HF_HUB_OFFLINE" in out


def test_render_refuses_compose_stacks(workspace, cli) -> None:
    code, _, err = cli("stacks", "render", "diffusiongemma")
    assert code == 1 and "compose/diffusiongemma" in err


def test_list_and_show(workspace, cli) -> None:
    code, out, _ = cli("stacks", "list")
    assert code == 0 and "qwen36-dflash" in out and "diffusiongemma" in out and "qwen36-base" not in out
    code, out, _ = cli("stacks", "show", "qwen36-dflash")
    assert code == 0 and "spec-hash" in out and "Hikari07jp/DSpark-Qwen3.6-27B-AEON-draft" in out


@pytest.mark.parametrize("address", ["0.0.0.0:9000", "192.168.1.5:9000", "example.com:80"])
def test_the_api_tcp_listener_is_loopback_only(monkeypatch: pytest.MonkeyPatch, address: str) -> None:
    from pydantic import ValidationError

    monkeypatch.setenv("SPARKCTL_API_TCP", address)
    with pytest.raises(ValidationError):
        Settings()


@pytest.mark.parametrize("raw", ["hf_abcdefghijklmnop\r\n", "  hf_abcdefghijklmnop ", "hf_abcdefghijklmnop\n"])
def test_a_token_read_from_a_file_is_stripped(monkeypatch: pytest.MonkeyPatch, raw: str) -> None:
    monkeypatch.setenv("SPARKCTL_HF_TOKEN", raw)
    assert Settings().hf_token.get_secret_value() == "hf_abcdefghijklmnop"


def test_a_token_with_whitespace_inside_is_refused_without_repeating_it(workspace, cli, monkeypatch) -> None:
    monkeypatch.setenv("SPARKCTL_HF_TOKEN", "hf_abcdefgh\rijklmnop")
    code, out, err = cli("stacks", "list")
    assert code == 1 and "SPARKCTL_HF_TOKEN is invalid" in err and "abcdefgh" not in out + err


def test_the_cli_error_line_never_shows_a_token(workspace, cli, monkeypatch) -> None:
    monkeypatch.setenv("SPARKCTL_HF_TOKEN", "hf_abcdefghijklmnop")
    code, _, err = cli("stacks", "show", "hf_abcdefghijklmnop")  # an error message that quotes its input
    assert code == 1 and "hf_abcdefghijklmnop" not in err and "**********" in err


def test_engine_env_may_not_carry_a_token(workspace, cli, monkeypatch) -> None:
    monkeypatch.setenv("SPARKCTL_ENGINE_ENV", "VLLM_LOGGING_LEVEL=DEBUG,HF_TOKEN=hf_abcdefghijklmnop")
    code, out, err = cli("stacks", "list")
    assert code == 1 and "SPARKCTL_ENGINE_ENV is invalid" in err and "hf_abcdefghijklmnop" not in out + err
