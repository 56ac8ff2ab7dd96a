"""The rendered qwen36-dflash container, created (not started) on a real Docker engine."""

from __future__ import annotations

import subprocess
from dataclasses import replace
from pathlib import Path

from sparkctl.spec.load import load_catalog
from sparkctl.spec.render import Sources, render
from tests.conftest import TEST_LABEL

ROOT = Path(__file__).resolve().parents[2]
VLLM = "/usr/local/lib/python3.12/site-packages/vllm"


def test_qwen36_dflash_container_as_docker_sees_it(engine, base_image, run_id, tmp_path: Path) -> None:
    stack = load_catalog(ROOT / "stacks", ROOT / "patches").stack("qwen36-dflash")
    subprocess.run(["docker", "tag", base_image, stack.image.ref], check=True)
    model, draft, cache = (tmp_path / d for d in ("model", "draft", "cache"))
    overlay = tmp_path / "overlay" / "dflash.py"
    for d in (model, draft, cache, overlay.parent):
        d.mkdir(parents=True)
    overlay.write_text("# shimmed\n")
    target = f"{VLLM}/v1/spec_decode/dflash.py"
    plan = render(stack, Sources(model_dir=str(model), draft_dir=str(draft), overlays=((str(overlay), target),),
                                 compile_cache_dir=str(cache)))
    plan = replace(plan, name=f"{plan.name}-{run_id}")
    try:
        engine.create(plan, labels={TEST_LABEL: run_id})
        info = engine.client.api.inspect_container(plan.name)
    finally:
        subprocess.run(["docker", "rmi", stack.image.ref], check=True, capture_output=True)

    config, host = info["Config"], info["HostConfig"]
    assert info["State"]["Status"] == "created"
    assert config["Labels"]["sparkctl.stack"] == "qwen36-dflash"
    assert config["Labels"]["sparkctl.spec-hash"] == plan.labels["sparkctl.spec-hash"]
    assert host["NetworkMode"] == "host" and host["IpcMode"] == "host"
    assert host["ShmSize"] == 16 * 1024**3
    [gpus] = host["DeviceRequests"]
    assert (gpus["Count"], gpus["Capabilities"]) == (-1, [["gpu"]])  # --gpus all
    mounts = {m["Target"]: m for m in host["Mounts"]}
    assert all(mounts[t].get("ReadOnly") for t in ("/model", "/draft", target))
    assert not mounts["/root/.cache/vllm"].get("ReadOnly")
    assert config["Entrypoint"] == ["vllm"]
    assert config["Cmd"] == list(plan.command)
    assert config["Cmd"][:2] == ["serve", "/model"] and "--speculative-config" in config["Cmd"]
    assert "HF_HUB_OFFLINE=1" in config["Env"]
    assert not [e for e in config["Env"] if "TOKEN" in e]
