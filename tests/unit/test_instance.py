"""Instances: names derived from the state dir, names in containers and compose projects,
ownership by label (old unlabelled containers belong to the default instance), shifted ports,
and the compose override carrying sparkctl's labels."""

from __future__ import annotations

from pathlib import Path

import pytest
from ruamel.yaml import YAML

from sparkctl import instance
from sparkctl.adapters.compose import override
from sparkctl.instance import default_state_dir
from sparkctl.settings import Settings
from sparkctl.spec.load import load_catalog
from sparkctl.spec.render import Sources, render

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for var in ("SPARKCTL_INSTANCE", "SPARKCTL_STATE_DIR", "SPARKCTL_PORT_OFFSET"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("XDG_STATE_HOME", str(tmp_path / "xdg"))
    monkeypatch.chdir(tmp_path)
    return tmp_path


def test_the_default_state_dir_is_the_default_instance(clean_env) -> None:
    s = Settings()
    assert (s.instance, s.state_dir) == ("default", clean_env / "xdg" / "sparkctl")


def test_another_state_dir_derives_its_own_instance(clean_env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKCTL_STATE_DIR", str(clean_env / "My State"))
    first = Settings().instance
    monkeypatch.setenv("SPARKCTL_STATE_DIR", str(clean_env / "other" / "My State"))
    second = Settings().instance
    assert first.startswith("my-state-") and second.startswith("my-state-") and first != second


def test_a_named_instance_gets_its_own_state_dir(clean_env, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("SPARKCTL_INSTANCE", "staging")
    s = Settings()
    assert (s.instance, s.state_dir) == ("staging", clean_env / "xdg" / "sparkctl-staging")
    assert s.overlays_dir == s.state_dir / "overlays" / "staging"


@pytest.mark.parametrize("bad", ["Upper", "with_underscore", "-lead", "x" * 40, "a b"])
def test_bad_instance_names_are_refused(clean_env, monkeypatch: pytest.MonkeyPatch, bad: str) -> None:
    monkeypatch.setenv("SPARKCTL_INSTANCE", bad)
    with pytest.raises(ValueError, match="instance"):
        Settings()


@pytest.mark.parametrize(("labels", "who", "owned"), [
    ({"sparkctl.stack": "a", "sparkctl.instance": "default"}, "default", True),
    ({"sparkctl.stack": "a"}, "default", True),  # made before instances: the default instance adopts it
    ({"sparkctl.stack": "a"}, "test-1", False),
    ({"sparkctl.stack": "a", "sparkctl.instance": "test-1"}, "default", False),
    ({"sparkctl.stack": "a", "sparkctl.instance": "test-1"}, "test-1", True),
])
def test_ownership(labels: dict, who: str, owned: bool) -> None:
    assert instance.owned(labels, who) is owned


def test_names_never_collide() -> None:
    assert instance.container_name("qwen36-dflash", "default") == "sparkctl-qwen36-dflash"
    assert instance.container_name("dflash", "qwen36") == "sparkctl-qwen36_dflash"
    assert instance.container_name("dflash", "qwen36") != instance.container_name("qwen36-dflash", "default")


def test_render_labels_and_names_by_instance() -> None:
    stack = load_catalog(ROOT / "stacks", ROOT / "patches").stack("qwen36-nvfp4-stock")
    plan = render(stack, Sources("/hf/model"), instance="test-1")
    assert plan.name == "sparkctl-test-1_qwen36-nvfp4-stock" and plan.labels["sparkctl.instance"] == "test-1"


def test_port_offset_moves_every_engine_port() -> None:
    shipped = load_catalog(ROOT / "stacks", ROOT / "patches")
    shifted = load_catalog(ROOT / "stacks", ROOT / "patches", port_offset=12000)
    for stack in shipped.deployable():
        assert shifted.stack(stack.name).port == stack.port + 12000
    assert "--port 20107" in render(shifted.stack("qwen36-dflash"), Sources("/m", "/d")).docker_run()


def test_the_compose_override_carries_sparkctls_labels() -> None:
    text = override("vllm", {}, {"sparkctl.stack": "diffusiongemma", "sparkctl.instance": "test-1"}, gpus=False)
    labels = YAML(typ="safe").load(text.replace("!reset", ""))["services"]["vllm"]["labels"]
    assert labels == {"sparkctl.instance": "test-1", "sparkctl.stack": "diffusiongemma"}
    assert "deploy: !reset {}" in text


def test_default_state_dir_names_the_instance(clean_env) -> None:
    assert default_state_dir("x").name == "sparkctl-x" and default_state_dir().name == "sparkctl"


def test_a_listing_becomes_a_typed_container() -> None:
    from sparkctl.container import Container

    c = Container.from_listing({"Id": "abc", "Names": ["/sparkctl-a"], "State": "running", "Created": 5,
                                "Labels": {"sparkctl.stack": "a", "sparkctl.gpu-memory": "0.4"}})
    assert (c.stack, c.instance, c.labelled, c.running, c.memory, c.fingerprint) == ("a", "default", False, True,
                                                                                    0.4, None)


