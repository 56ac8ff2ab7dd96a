"""The deploy pipeline against real vLLM (CPU build): the shim on vLLM's own dflash.py, and a
stack brought up through every health phase, canary included, that parks by stopping (the CPU
backend has no sleep mode)."""

from __future__ import annotations

import difflib
import json

import pytest

from sparkctl.deploy.edits import apply_shim
from sparkctl.deploy.patches import find_vllm
from sparkctl.sim.main import SHIM_ATTRIBUTES
from tests.conftest import image_policy, ours
from tests.integration.conftest import DaemonProcess

SHIM = dict(zip(SHIM_ATTRIBUTES, ("()", "{}"), strict=True))


def test_shim_applies_to_the_real_dflash_py_and_is_idempotent(engine, images, tmp_path) -> None:
    image = images["vllm-cpu"]
    vllm = find_vllm(engine, image, "test-digest", cache=tmp_path / "vllm-dirs.json")
    assert vllm.endswith("site-packages/vllm")
    path = f"{vllm}/v1/spec_decode/dflash.py"
    original = engine.read_files(image, [path])[path].decode()
    assert "class DFlashProposer(SpecDecodeBaseProposer):" in original
    shimmed = apply_shim(original, "DFlashProposer", SHIM, filename=path)
    added = [line for line in difflib.ndiff(original.splitlines(), shimmed.splitlines()) if line[:2] in ("+ ", "- ")]
    assert added == ["+     _draft_kv_cache_group_ids = ()", "+     _draft_layer_to_kv_cache_gid = {}"]
    assert apply_shim(shimmed, "DFlashProposer", SHIM, filename=path) == shimmed
    assert json.loads((tmp_path / "vllm-dirs.json").read_text()) == {"test-digest": vllm}


@pytest.mark.timeout(900)  # ~2 min here: two engine starts (the first refused for its sleep mode) and a wake
def test_a_stack_on_real_vllm_goes_through_every_phase_and_parks_by_stopping(workspace, hub, engine, cli,
                                                                              monkeypatch) -> None:
    """vLLM's CPU backend has no sleep mode and refuses to start with --enable-sleep-mode: the
    first start learns that for the digest, the engine starts again without it, and parking the
    stack stops it, saying why."""
    monkeypatch.setenv("SPARKCTL_HF_ENDPOINT", hub.endpoint)
    monkeypatch.setenv("SPARKCTL_GPUS", "none")
    (workspace / "stacks" / "tiny-cpu.yaml").write_text(
        "name: tiny-cpu\n"
        "image: {repository: sparkctl-test/vllm-cpu, tag: '0.32.0'}\n"
        "model: {repo: AEON-7/Qwen3.6-27B-AEON-Ultimate-Uncensored-NVFP4}\n"
        "vllm: {served_model_name: tiny, port: 8190, max_model_len: 2048, enforce_eager: true}\n"
        "resources: {gpu_memory_utilization: 0.2}\n"
        "container: {shm_size: 1g}\n"
        "health: {load: 300}\n")
    daemon = DaemonProcess(workspace / "state")
    try:
        code, out, err = cli("up", "tiny-cpu")
        assert code == 0, err + out
        for phase in ("starting", "loading", "ready", "canary", "running"):
            assert phase in out
        assert "local build" in out and "tiny-cpu up: http://127.0.0.1:" in out
        assert "its platform has no sleep mode" in out and "started again without it" in out
        assert "full-context requests fit (KV cache" in out  # read from the real engine, through the daemon
        # Its KV cache is the one sparkctl planned in bytes (issue 46), and the real engine took that size.
        [running] = [c for c in ours(engine, "tiny-cpu") if c["State"] == "running"]
        command = engine.client.api.inspect_container(running["Id"])["Config"]["Cmd"]
        [kv] = [int(a.split("=")[1]) for a in command if a.startswith("--kv-cache-memory-bytes=")]
        assert f"Explicitly set ({round(kv / 2**30, 2)}/" in engine.client.api.logs(running["Id"]).decode()
        [row] = json.loads(cli("status", "--json")[1])
        assert row["kv"]["max_model_len"] == 2048 and row["kv"]["kv_tokens"] >= 2048
        [(digest, wake)] = image_policy(workspace).wakes.items()
        assert wake.ok is False and "Sleep mode is not supported on current platform" in wake.reason
        code, out, err = cli("park", "tiny-cpu")
        assert code == 0 and f"stop: image {digest} cannot sleep and wake" in " ".join(out.split()), err + out
        assert [c["State"] for c in ours(engine, "tiny-cpu")] == ["exited"]
        code, out, err = cli("wake", "tiny-cpu")
        assert code == 0 and "tiny-cpu is awake (cold" in out, err + out
        assert [c["State"] for c in ours(engine, "tiny-cpu")] == ["running"]
    finally:
        cli("down", "tiny-cpu")
        daemon.stop()
    assert not ours(engine, "tiny-cpu")
