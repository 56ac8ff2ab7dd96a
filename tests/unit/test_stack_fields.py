"""A stack's ordinary fields add to what sparkctl gives the engine and never replace it: the
compose variables and engine variables sparkctl sets are refused by name; a service name is a
compose service name, and the override file is emitted, so no name or value adds keys of its
own; a custom entrypoint and vLLM's `VLLM_*` settings need their opt-in; and `--config`, a file
of flags no check reads, is refused however it is spelled."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
from pydantic import ValidationError
from ruamel.yaml import YAML

from sparkctl.adapters.compose import override
from sparkctl.deploy.launch import Launch
from sparkctl.settings import Settings
from sparkctl.spec.engine import COMPOSE_VARIABLES, ENGINE_VARIABLES
from sparkctl.spec.models import Stack

IMAGE = {"repository": "vllm/vllm-openai", "tag": "v0.24.0"}


def vllm_stack(**fields) -> Stack:
    return Stack.model_validate({"name": "s", "image": IMAGE, "model": {"repo": "a/b"}, "vllm": {}} | fields)


def compose_stack(**compose) -> Stack:
    return Stack.model_validate({"name": "c", "kind": "compose", "image": IMAGE, "model": {"repo": "a/b"},
                                 "compose": {"project": "p", "service": "vllm", "served_model_name": "m",
                                             "port": 8111} | compose})


@pytest.mark.parametrize("key", sorted(COMPOSE_VARIABLES))
def test_compose_env_may_not_replace_a_variable_sparkctl_sets(key: str) -> None:
    with pytest.raises(ValidationError, match=rf"{key} is set by sparkctl itself"):
        compose_stack(env={key: "/run"})
    assert compose_stack(env={"MAX_NUM_SEQS": "8"}).compose.env == {"MAX_NUM_SEQS": "8"}


@pytest.mark.parametrize("key", ["COMPOSE_PROFILES", "COMPOSE_FILE", "compose_project_name", "DOCKER_HOST"])
def test_compose_env_may_not_configure_compose_itself(key: str) -> None:
    with pytest.raises(ValidationError, match=rf"{key} would configure docker compose itself"):
        compose_stack(env={key: "download"})


def test_sparkctl_sets_exactly_the_variables_compose_env_may_not(tmp_path: Path) -> None:
    settings = Settings(state_dir=tmp_path / "state", hf_cache_dir=tmp_path / "hf")
    launch = Launch(settings, None, None, None, None, placed=False, rank=None)  # type: ignore[arg-type]
    prepared = SimpleNamespace(image=SimpleNamespace(run_ref="vllm/vllm-openai@sha256:" + "0" * 64),
                               fingerprint="f" * 16)
    assert set(launch.variables(compose_stack(), prepared)) == COMPOSE_VARIABLES  # type: ignore[arg-type]
    assert launch.variables(compose_stack(), prepared)["HOST"] == "127.0.0.1"  # type: ignore[arg-type]


@pytest.mark.parametrize("service", ["vllm:\n    privileged: true", "vllm: {privileged: true}", "a b", "-x", "",
                                     "vllm\n", "x#y", "vllm:\n    volumes: ['/:/host']"])
def test_a_service_name_is_a_compose_service_name(service: str) -> None:
    with pytest.raises(ValidationError, match="compose.service"):
        compose_stack(service=service)


@pytest.mark.parametrize("service", ["vllm", "engine_1", "my-engine.v2"])
def test_the_override_file_says_exactly_what_sparkctl_puts_in_it(service: str) -> None:
    hostile = {"A": "1\n    privileged: true", "B": "x: y", "C": "'\"{}!reset"}
    for name in (service, "vllm:\n    privileged: true\n  other"):  # the emitter holds even past the spec check
        text = override(name, hostile, {"sparkctl.stack": "s: t\nprivileged: true"}, gpus=False)
        parsed = YAML(typ="rt").load(text)
        assert list(parsed) == ["services"] and list(parsed["services"]) == [name]
        settings = parsed["services"][name]
        assert set(settings) == {"labels", "environment", "deploy"}
        assert dict(settings["environment"]) == hostile
        assert dict(settings["labels"]) == {"sparkctl.stack": "s: t\nprivileged: true"}
        assert settings["deploy"].tag.value == "!reset" and dict(settings["deploy"]) == {}
    assert "deploy" not in YAML(typ="rt").load(override(service, {}, {"a": "b"}, gpus=True))["services"][service]


@pytest.mark.parametrize("key", sorted(ENGINE_VARIABLES))
def test_container_env_may_not_replace_an_engine_variable_sparkctl_sets(key: str) -> None:
    with pytest.raises(ValidationError, match=rf"{key} is set by sparkctl itself"):
        vllm_stack(container={"env": {key: "0"}}, allow=["vllm-env"])


@pytest.mark.parametrize("env", [{"VLLM_ALLOW_RUNTIME_LORA_UPDATING": "1"}, {"vllm_allow_insecure_serialization": "1"},
                                 {"VLLM_TORCH_PROFILER_DIR": "/tmp"}, {"VLLM_LOGGING_CONFIG_PATH": "/model/x.json"}])
def test_a_vllm_setting_by_environment_needs_its_opt_in(env: dict[str, str]) -> None:
    with pytest.raises(ValidationError, match=r"container.env: .* set vLLM settings .* add `allow: \[vllm-env\]`"):
        vllm_stack(container={"env": env})
    assert vllm_stack(container={"env": env}, allow=["vllm-env"]).container.env == env
    assert vllm_stack(container={"env": {"OMP_NUM_THREADS": "4"}}).risks() == []


@pytest.mark.parametrize("entrypoint", [["/bin/sh", "-c", 'exec vllm "$@" --host 0.0.0.0', "sh"], ["python3"], None,
                                        ["vllm", "--host", "0.0.0.0"], []])
def test_an_entrypoint_other_than_vllm_needs_its_opt_in(entrypoint: list[str] | None) -> None:
    with pytest.raises(ValidationError, match=r"container.entrypoint: .* add `allow: \[entrypoint\]`"):
        vllm_stack(container={"entrypoint": entrypoint})
    assert [r for r, _ in vllm_stack(container={"entrypoint": entrypoint}, allow=["entrypoint"]).risks()] == [
        "entrypoint"]
    assert vllm_stack(container={"entrypoint": ["vllm"]}).risks() == []


@pytest.mark.parametrize("args", [["--config", "/model/c.yaml"], ["--config=/model/c.yaml"], ["--conf", "x"],
                                  ["--max-num-seqs", "4", "--config"], ["--config", "/draft/x.yaml", "--port", "1"]])
def test_a_config_file_of_flags_is_refused(args: list[str]) -> None:
    with pytest.raises(ValidationError, match=r"(?s)vllm.extra_args.*--config makes vLLM read more flags from a file"):
        vllm_stack(vllm={"extra_args": args})
    assert vllm_stack(vllm={"extra_args": ["--config-format", "auto"]}).vllm.extra_args  # another flag


@pytest.mark.parametrize("path", ["models", "./m", "~/models"])
def test_a_local_weights_path_is_absolute(path: str) -> None:
    with pytest.raises(ValidationError, match="model.path"):
        Stack.model_validate({"name": "s", "image": IMAGE, "model": {"path": path}, "vllm": {}})
