"""Fixture repos for the local Hub, named like the real ones the shipped stacks use.

Each holds a tiny model (config, tokenizer, safetensors) built from one model dir; the DSpark
draft also carries `vllm_patches/` whose files the simulated engine recognises by content.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.fakes.hub import Repo

QWEN_NVFP4 = "AEON-7/Qwen3.6-27B-AEON-Ultimate-Uncensored-NVFP4"
QWEN_BF16 = "AEON-7/Qwen3.6-27B-AEON-Ultimate-Uncensored-BF16"
DSPARK_DRAFT = "Hikari07jp/DSpark-Qwen3.6-27B-AEON-draft"
ZLAB_DRAFT = "z-lab/Qwen3.6-27B-DFlash"  # qwen36-dflash-v4's drafter (the repo id is unverified)
GEMMA4 = "AEON-7/Gemma-4-26B-A4B-it-Uncensored-NVFP4"
GEMMA4_DRAFTER = "z-lab/gemma-4-26B-A4B-it-DFlash"
DIFFUSIONGEMMA = "nvidia/diffusiongemma-26B-A4B-it-NVFP4"

QWEN3_DFLASH_PATCH = '''"""DSpark DFlash draft head for vLLM: block-diffusion drafter + Markov head (fixture)."""

DSPARK_PATCH = "qwen3_dflash"


class DSparkDFlashHead:
    """Drafts up to K tokens per step from the target's hidden states."""

    max_draft_tokens = 10
'''
LLM_BASE_PROPOSER_PATCH = '''"""Speculative base proposer with the KV-cache group tables DSpark reads (fixture)."""

DSPARK_PATCH = "llm_base_proposer"


class SpecDecodeBaseProposer:
    def load_model(self, target_model):
        return (self._draft_kv_cache_group_ids, self._draft_layer_to_kv_cache_gid)
'''


def seed_repos(model_dir: Path) -> dict[str, Repo]:
    """Every repo the shipped stacks name. DiffusionGemma is served gated, to exercise that path
    (whether NVIDIA's repo is gated is unverified; the seed sets HF_TOKEN for it)."""
    base = {p.name: p.read_bytes() for p in sorted(model_dir.iterdir()) if p.is_file()}

    def variant(name: str) -> dict[str, bytes]:
        config = json.loads(base["config.json"]) | {"_name_or_path": name}
        return base | {"config.json": json.dumps(config, indent=2).encode(), "README.md": f"# {name}\n".encode()}

    return {
        QWEN_NVFP4: Repo(variant(QWEN_NVFP4)),
        QWEN_BF16: Repo(variant(QWEN_BF16)),
        DSPARK_DRAFT: Repo(variant(DSPARK_DRAFT) | {
            "vllm_patches/qwen3_dflash.py": QWEN3_DFLASH_PATCH.encode(),
            "vllm_patches/llm_base_proposer.py": LLM_BASE_PROPOSER_PATCH.encode()}),
        ZLAB_DRAFT: Repo(variant(ZLAB_DRAFT)),  # no vllm_patches: the qwen36-v4 image drafts with it natively
        GEMMA4: Repo(variant(GEMMA4)),
        GEMMA4_DRAFTER: Repo(variant(GEMMA4_DRAFTER)),
        DIFFUSIONGEMMA: Repo(variant(DIFFUSIONGEMMA), gated=True),
    }
