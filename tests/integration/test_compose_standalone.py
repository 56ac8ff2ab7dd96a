"""The DiffusionGemma compose project works standalone, the seed's way: copy it, put HF_TOKEN in
`.env` (from `.env.example`), `docker compose up -d --build`. Its `download` container fetches
the gated weights with the token from the local Hub; the engine starts only after it, offline,
never holds the token, and has the HF cache read-only.

One file beside the project's own is added, for this machine only: the sim engine in place of
vLLM (BASE_IMAGE), the sim at its test speed, no GPU reservation (no NVIDIA runtime here), the
test run's label for cleanup, and this instance's port and Hub."""

from __future__ import annotations

import shutil
import subprocess
import time
from pathlib import Path

from sparkctl.adapters.compose import clean_call
from sparkctl.deploy.health import http_status
from tests.conftest import FAST, HUB_TOKEN, port
from tests.neighbours import TEST_LABEL

ROOT = Path(__file__).resolve().parents[2]


def test_the_project_runs_standalone_with_the_token_in_env_only(world, hub, images, run_id, engine,
                                                                tmp_path: Path) -> None:
    project = tmp_path / "diffusiongemma"
    shutil.copytree(ROOT / "compose" / "diffusiongemma", project)
    served = port(8111)
    env = (project / ".env.example").read_text().replace("HF_TOKEN=\n", f"HF_TOKEN={HUB_TOKEN}\n")
    env = env.replace("PORT=8111\n", f"PORT={served}\n")
    (project / ".env").write_text(env + f"HF_ENDPOINT={hub.endpoint}\nBASE_IMAGE={images['sim']}\n"
                                  f"IMAGE=sparkctl-test/diffusiongemma-{run_id}:local\n")
    (project / "here.yml").write_text(
        f"services:\n  download:\n    labels: {{{TEST_LABEL}: '{run_id}'}}\n"
        f"  vllm:\n    labels: {{{TEST_LABEL}: '{run_id}'}}\n    environment: {{{FAST.replace('=', ': ')}}}\n"
        "    deploy: !reset {}\n")
    compose = [*clean_call(None), "compose", "-p", f"dg-{run_id}", "-f", "compose.yml", "-f", "here.yml"]
    try:
        up = subprocess.run([*compose, "up", "-d", "--build"], cwd=project, capture_output=True, text=True,
                            timeout=300)
        assert up.returncode == 0, up.stderr[-3000:]
        deadline = time.monotonic() + 240
        while http_status(f"http://127.0.0.1:{served}/health") != 200:
            assert time.monotonic() < deadline, "the engine did not answer /health within 240 s"
            time.sleep(0.5)
        download, vllm = (engine.client.api.inspect_container(f"dg-{run_id}-{service}-1")
                          for service in ("download", "vllm"))
        assert download["State"]["ExitCode"] == 0 and f"HF_TOKEN={HUB_TOKEN}" in download["Config"]["Env"]
        assert not any(HUB_TOKEN in entry for entry in vllm["Config"]["Env"] + vllm["Config"]["Cmd"])
        assert "HF_HUB_OFFLINE=1" in vllm["Config"]["Env"]
        hub_cache = {m["Destination"]: m for m in vllm["Mounts"]}["/root/.cache/huggingface/hub"]
        assert not hub_cache["RW"]  # the engine reads the weights the download fetched, and changes none
        assert list((project / "models" / "hf" / "hub").glob("models--nvidia--diffusiongemma-*/snapshots/*"))
    finally:
        subprocess.run([*compose, "down", "--rmi", "all"], cwd=project, capture_output=True, timeout=120)
