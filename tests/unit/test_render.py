"""Rendering is deterministic: golden files pin the container of three seed configurations.

Regenerate after an intended change with `SPARKCTL_UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/test_render.py`,
review the golden diff, and commit it with the change that caused it: a reviewer sees what moved.
"""

from __future__ import annotations

import json
import os
from dataclasses import replace
from pathlib import Path

import pytest

from sparkctl.deploy.patches import planned_mounts
from sparkctl.spec.load import load_catalog
from sparkctl.spec.models import Stack
from sparkctl.spec.render import GATE, Sources, render, spec_hash, vllm_args

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = Path(__file__).parent / "golden"
CATALOG = load_catalog(ROOT / "stacks", ROOT / "patches")
SOURCES = Sources(
    model_dir="/hf/models--target/snapshots/c0ffee",
    draft_dir="/hf/models--draft/snapshots/d1ce",
    compile_cache_dir="/state/compile-cache/x",
)


@pytest.mark.parametrize("name", ["qwen36-dflash", "aeon-gemma4-v2", "qwen36-nvfp4-stock"])
def test_golden(name: str) -> None:
    stack = CATALOG.stack(name)
    # Each file the stack's patch sets change, as `sparkctl stacks render` shows it once vLLM's
    # dir in the image is known: the overlay folder's name (a hash) is known only at deploy.
    overlays = planned_mounts([CATALOG.patch_sets[p] for p in stack.patches], patches_dir=ROOT / "patches",
                              overlays_dir=Path("/state/overlays/default"),
                              vllm_dir="/usr/local/lib/python3.12/site-packages/vllm")
    sources = replace(SOURCES, draft_dir=SOURCES.draft_dir if stack.draft else None, overlays=overlays)
    plan = render(stack, sources, fingerprint="fp-test")
    rendered = plan.to_json() + "\n" + plan.docker_run() + "\n"
    golden = GOLDEN / f"{name}.txt"
    if os.environ.get("SPARKCTL_UPDATE_GOLDEN"):
        golden.write_text(rendered)
    assert rendered == golden.read_text(), (
        f"{name} renders differently from {golden.relative_to(ROOT)}. If the change is intended, regenerate with "
        "`SPARKCTL_UPDATE_GOLDEN=1 .venv/bin/pytest tests/unit/test_render.py`, review `git diff tests/unit/golden` "
        "line by line, and commit the golden diff with the change that caused it.")


def test_qwen36_dflash_has_the_seed_args() -> None:
    args = " ".join(vllm_args(CATALOG.stack("qwen36-dflash")))
    assert ("--max-model-len 131072 --gpu-memory-utilization 0.8 --no-enable-prefix-caching "
            "--enable-chunked-prefill --quantization compressed-tensors --attention-backend flash_attn "
            "--mamba-cache-dtype float32 --speculative-config "
            '{"method":"dflash","model":"/draft","num_speculative_tokens":8,"draft_sample_method":"probabilistic"}'
            ) in args


def test_every_seed_config_renders_offline_with_no_token() -> None:
    for stack in CATALOG.deployable():
        if stack.kind != "vllm":
            continue
        plan = render(stack, SOURCES)
        assert plan.env["HF_HUB_OFFLINE"] == "1"
        assert not any("TOKEN" in key for key in plan.env)
        assert all(m.read_only for m in plan.mounts if m.target in ("/model", "/draft"))
        assert plan.network_mode == "host" and plan.entrypoint == ("vllm",)


def test_spec_hash_tracks_content_not_layout() -> None:
    stack = CATALOG.stack("qwen36-dflash")
    same = Stack.model_validate(stack.model_dump(by_alias=True))
    assert spec_hash(same) == spec_hash(stack)
    changed = stack.model_copy(update={"description": "other"})
    assert spec_hash(changed) != spec_hash(stack)


def test_the_nine_seed_configs_exist() -> None:
    nine = {"qwen36-bf16-stock", "qwen36-bf16-eugr", "qwen36-bf16-aeon", "qwen36-nvfp4-stock",
            "qwen36-nvfp4-eugr", "qwen36-nvfp4-aeon", "qwen36-bf16-dflash-n1", "qwen36-bf16-dflash-n8",
            "qwen36-dflash"}
    assert nine <= {s.name for s in CATALOG.deployable()}
    n1 = CATALOG.stack("qwen36-bf16-dflash-n1")
    assert n1.vllm.speculative.num_speculative_tokens == 1 and n1.vllm.quantization is None
    assert n1.model.repo.endswith("-BF16") and n1.patches == ("dspark-dflash",)
    command = render(n1, SOURCES).command
    assert json.loads(command[command.index("--speculative-config") + 1])["num_speculative_tokens"] == 1


def test_a_gated_plan_runs_the_engines_command_through_the_gate() -> None:
    plan = render(CATALOG.stack("qwen36-dflash"), SOURCES, fingerprint="fp-test")  # its stack names `vllm`
    gated = plan.gated(["python3", "-m", "vllm.entrypoints.cli.main"])
    assert gated.entrypoint == ("/bin/sh", "-c", GATE, "sparkctl-gate", "vllm") and gated.stdin_open
    assert replace(gated, entrypoint=plan.entrypoint, stdin_open=False) == plan
    assert replace(plan, entrypoint=None).gated(["vllm"]).entrypoint[4:] == ("vllm",)  # else the image's
    assert " -i " in gated.docker_run()
