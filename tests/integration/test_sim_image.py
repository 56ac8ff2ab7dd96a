"""The sim image in real containers: DFlash patch checks like the real engine's, injected
faults, and the registry serving it under the real repository names."""

from __future__ import annotations

import io
import json
import shutil
import tarfile
from pathlib import Path

import pytest

from sparkctl.sim.main import SHIM_ATTRIBUTES
from tests.conftest import wait_for
from tests.fakes.repos import LLM_BASE_PROPOSER_PATCH, QWEN3_DFLASH_PATCH

VLLM = "/opt/sim/lib/python3.11/site-packages/vllm"
DFLASH = {"method": "dflash", "model": "/draft", "num_speculative_tokens": 8, "draft_sample_method": "probabilistic"}
FAST = {"SPARKCTL_SIM_TIME_SCALE": "0.001"}


def image_file(engine, image: str, path: str) -> str:
    """Read a file out of an image through a created, never-started container."""
    container = engine.client.containers.create(image, ["--version"])
    try:
        stream, _ = container.get_archive(path)
        with tarfile.open(fileobj=io.BytesIO(b"".join(stream))) as tar:
            return tar.extractfile(tar.getmembers()[0]).read().decode()
    finally:
        container.remove()


@pytest.fixture
def dspark(tmp_path: Path, tiny_model_dir: Path) -> Path:
    """A DSpark-like draft: model files plus the `vllm_patches/` its head lives in."""
    shutil.copytree(tiny_model_dir, tmp_path / "dspark")
    (tmp_path / "dspark" / "vllm_patches").mkdir()
    (tmp_path / "dspark" / "vllm_patches" / "qwen3_dflash.py").write_text(QWEN3_DFLASH_PATCH)
    (tmp_path / "dspark" / "vllm_patches" / "llm_base_proposer.py").write_text(LLM_BASE_PROPOSER_PATCH)
    return tmp_path / "dspark"


@pytest.fixture
def draft(tmp_path: Path, dspark: Path) -> dict[str, str]:
    """Mounts for a DFlash start: the draft dir and both DSpark overlay files."""
    overlays = tmp_path / "overlays"
    overlays.mkdir()
    (overlays / "qwen3_dflash.py").write_text(QWEN3_DFLASH_PATCH)
    (overlays / "llm_base_proposer.py").write_text(LLM_BASE_PROPOSER_PATCH)
    return {str(dspark): "/draft",
            str(overlays / "qwen3_dflash.py"): f"{VLLM}/model_executor/models/qwen3_dflash.py",
            str(overlays / "llm_base_proposer.py"): f"{VLLM}/v1/spec_decode/llm_base_proposer.py"}


def test_dflash_without_the_shim_dies_like_vllm(start_engine, draft) -> None:
    served = start_engine("sim", "--speculative-config", json.dumps(DFLASH), env=FAST, mounts=draft)
    assert served.wait_exit() == 1
    assert f"AttributeError: 'DFlashProposer' object has no attribute '{SHIM_ATTRIBUTES[0]}'" in served.logs()


def test_dflash_without_the_overlays_fails_to_import(start_engine, dspark) -> None:
    served = start_engine("sim", "--speculative-config", json.dumps(DFLASH), env=FAST, mounts={str(dspark): "/draft"})
    assert served.wait_exit() == 1
    assert "the draft's vllm_patches are not applied" in served.logs()


def test_a_drafter_the_image_supports_natively_needs_no_overlays(start_engine, tiny_model_dir) -> None:
    served = start_engine("sim", "--speculative-config", json.dumps(DFLASH), env=FAST,
                          mounts={str(tiny_model_dir): "/draft"})  # AEON Gemma-4's drafter: no vllm_patches/
    served.wait_ready(timeout=30)


def test_dflash_with_overlays_and_shim_serves(engine, images, start_engine, draft, tmp_path: Path) -> None:
    original = image_file(engine, images["sim"], f"{VLLM}/v1/spec_decode/dflash.py")
    header = "class DFlashProposer(SpecDecodeBaseProposer):\n"
    shim = "".join(f"    {name} = {value}\n" for name, value in zip(SHIM_ATTRIBUTES, ("()", "{}"), strict=True))
    shimmed = tmp_path / "dflash.py"
    shimmed.write_text(original.replace(header, header + shim))
    served = start_engine("sim", "--speculative-config", json.dumps(DFLASH), env=FAST,
                          mounts=draft | {str(shimmed): f"{VLLM}/v1/spec_decode/dflash.py"})
    served.wait_ready(timeout=30)
    assert "sim profile qwen36-dflash-n8" in served.logs()  # chosen from the model and the config


def test_crash_after_n_requests_exits(start_engine) -> None:
    served = start_engine("sim", "--sim-crash-after", "2", env=FAST)
    served.wait_ready(timeout=30)
    body = json.dumps({"model": "tiny", "prompt": "x", "max_tokens": 4}).encode()
    import urllib.request

    for _ in range(2):
        urllib.request.urlopen(urllib.request.Request(served.url + "/v1/completions", body,
                                                      {"Content-Type": "application/json"}), timeout=10).read()
    try:
        urllib.request.urlopen(urllib.request.Request(served.url + "/v1/completions", body,
                                                      {"Content-Type": "application/json"}), timeout=10).read()
    except OSError:
        pass
    assert served.wait_exit() == 1
    assert "EngineCore encountered a fatal error" in served.logs()


def test_hang_on_load_never_opens_the_port(start_engine) -> None:
    served = start_engine("sim", env=FAST | {"SPARKCTL_SIM_FAULTS": "hang_on_load"})
    # the fault's hang, logged as it starts: from there on the sim sleeps forever, its port never open
    wait_for(lambda: "Loading weights ..." in served.logs(), timeout=60, what="the sim to hang in loading",
             logs=served.logs)
    served.container.reload()
    assert served.container.status == "running" and served.status() is None


def test_unknown_flag_is_rejected_like_vllm(start_engine) -> None:
    served = start_engine("sim", "--max-model-length", "4096", env=FAST)
    assert served.wait_exit() == 2
    assert "unrecognized arguments: --max-model-length" in served.logs()


def test_registry_serves_the_sim_under_real_names(engine, images, registry) -> None:
    digests = registry.publish_sim(images["sim"])
    v2, latest = (digests[f"aeon-7/aeon-gemma-4-26b-a4b-dflash:{t}"] for t in ("v2", "latest"))
    assert v2 != latest  # the broken `latest` carries its own profile
    ref = f"{registry.host}/aeon-7/aeon-gemma-4-26b-a4b-dflash@{latest}"
    pulled = engine.client.images.pull(ref)
    assert "SPARKCTL_SIM_PROFILE=aeon-gemma4-latest-broken" in pulled.attrs["Config"]["Env"]
    moved = registry.move_tag("aeon-7/aeon-gemma-4-26b-a4b-dflash:v2", images["sim"], stamp="rebuild-1")
    assert moved != v2
    assert engine.client.images.get_registry_data(f"{registry.host}/aeon-7/aeon-gemma-4-26b-a4b-dflash:v2").id == moved
    engine.client.images.remove(ref, force=True)
