"""Seed 000 prints no command: it states its serving values in words and a few flags (000:17
"--max-model-len 131072 --gpu-memory-utilization 0.80, prefix caching off, chunked prefill on,
TP=1; DFlash configs add --attention-backend flash_attn"; the draft's n, probabilistic drafting
and float32 mamba cache, 000:10). Each of its nine configurations renders those values, flag by
flag, and beyond them only what docs/engines.md lists as sparkctl's: the command's shape and mount
points (`vllm serve /model`, the draft at `/draft`), the served name, loopback host and port,
`HF_HUB_OFFLINE=1`, `--quantization compressed-tensors` (inferred from the checkpoint's format,
000:9), and, unless `switch.park: stop`, parking by sleep, each named with the setting that causes
it. Seed 003's vLLM stacks, whose commands the seed does not print either, render what it states
and, beyond it, only the values docs/engines.md lists as not from the seed.

The seed's values are rebuilt here from its text, not from the stack files."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from sparkctl.policy.parking import Park
from sparkctl.spec.load import load_catalog
from sparkctl.spec.render import Sources, additions, render

ROOT = Path(__file__).resolve().parents[2]
CATALOG = load_catalog(ROOT / "stacks", ROOT / "patches")
SOURCES = Sources(model_dir="/hf/model", draft_dir="/hf/draft", compile_cache_dir="/cache")

# seed 000:17: "--max-model-len 131072 --gpu-memory-utilization 0.80, prefix caching off, chunked prefill on"
FIXED = {"--max-model-len": "131072", "--gpu-memory-utilization": "0.8",
         "--no-enable-prefix-caching": None, "--enable-chunked-prefill": None}
# sparkctl's, not the seed's: it says the NVFP4 checkpoint is "compressed-tensors" (000:9), not that a
# flag named it (vLLM reads the format from the checkpoint's config); docs/engines.md lists it
NVFP4 = {"--quantization": "compressed-tensors"}
# what the render adds to the seed's values besides parking by sleep, as docs/engines.md must name it
SPARKCTL_ADDS = ("`vllm serve /model`", "`/draft`", "`--served-model-name`", "`--host 127.0.0.1`", "port",
                 "`HF_HUB_OFFLINE=1`", "`--quantization compressed-tensors`", "read-only")
IMAGES = {"stock": "vllm/vllm-openai:v0.24.0", "eugr": "eugr/spark-vllm:latest",  # seed 000:11
          "aeon": "ghcr.io/aeon-7/aeon-vllm-ultimate:2026-06-18-v0.23.0-dflashfix"}


def dflash(n: int) -> dict[str, str | None]:
    """The draft's flags: seed 000:10 (n, probabilistic drafting, float32 mamba cache), 000:17 (flash_attn)."""
    config = {"method": "dflash", "model": "/draft", "num_speculative_tokens": n,
              "draft_sample_method": "probabilistic"}
    return {"--attention-backend": "flash_attn", "--mamba-cache-dtype": "float32",
            "--speculative-config": json.dumps(config, separators=(",", ":"))}


# stack -> (the seed's config, its engine, the flags beyond the fixed ones: the draft's, and NVFP4's
# inferred --quantization): seed 000:23-33
SEED_000 = {
    "qwen36-bf16-stock": ("Q_bf16_stock_n0", "stock", {}),
    "qwen36-bf16-eugr": ("Q_bf16_eugr_n0", "eugr", {}),
    "qwen36-bf16-aeon": ("Q_bf16_aeon_n0", "aeon", {}),
    "qwen36-nvfp4-stock": ("Q_nvfp4_stock_n0", "stock", NVFP4),
    "qwen36-nvfp4-eugr": ("Q_nvfp4_eugr_n0", "eugr", NVFP4),
    "qwen36-nvfp4-aeon": ("Q_nvfp4_aeon_n0", "aeon", NVFP4),
    "qwen36-bf16-dflash-n1": ("Q_bf16_dfl1", "aeon", dflash(1)),
    "qwen36-bf16-dflash-n8": ("Q_bf16_dfl8", "aeon", dflash(8)),
    "qwen36-dflash": ("Q_nvfp4_dfl8", "aeon", NVFP4 | dflash(8)),
}


def flags(argv: tuple[str, ...]) -> dict[str, str | None]:
    """`--flag value` and bare `--flag` as a mapping; a flag given twice fails the test."""
    found: dict[str, str | None] = {}
    for i, arg in enumerate(argv):
        if arg.startswith("--"):
            assert arg not in found, f"{arg} given twice"
            value = argv[i + 1] if i + 1 < len(argv) and not argv[i + 1].startswith("--") else None
            found[arg] = value
    return found


@pytest.mark.parametrize("name", sorted(SEED_000))
@pytest.mark.parametrize("park", [Park.STOP, Park.AUTO])
def test_a_seed_000_config_renders_the_seeds_values_and_only_the_listed_additions(name: str, park: Park) -> None:
    _, engine, extra = SEED_000[name]
    stack = CATALOG.stack(name)
    stack = stack.model_copy(update={"switch": stack.switch.model_copy(update={"park": park})})
    plan = render(stack, SOURCES)
    placed = {"--served-model-name": name, "--host": "127.0.0.1", "--port": str(stack.port)}  # sparkctl's
    added = additions(stack)
    expected = placed | FIXED | extra | {what: None for what, _ in added if what.startswith("--")}
    assert (plan.image, plan.entrypoint, plan.command[:2]) == (IMAGES[engine], ("vllm",), ("serve", "/model"))
    assert flags(plan.command[2:]) == expected
    env = {k: v for k, v in plan.env.items() if k != "HF_HUB_OFFLINE"}  # the engine runs offline: weights come first
    assert env == dict(what.split("=", 1) for what, _ in added if not what.startswith("--"))
    if park is Park.STOP:
        assert added == []  # the seed's values and sparkctl's placement, nothing that parks
    else:
        assert [what for what, _ in added] == ["--enable-sleep-mode", "VLLM_SERVER_DEV_MODE=1"]
        assert all(cause.startswith("switch.park: auto") for _, cause in added)


def speculative(n: int, **extra: str) -> dict[str, str]:
    config = {"method": "dflash", "model": "/draft", "num_speculative_tokens": n, **extra}
    return {"--speculative-config": json.dumps(config, separators=(",", ":"))}


# The seed sets no prefix-caching flag, so its setups ran vLLM's default, on: the stacks say it outright.
DEFAULT_ON = {"--enable-prefix-caching": None}
# stack -> (image, what the seed states, what docs/engines.md lists as not from the seed)
SEED_003 = {
    "qwen36-dflash-v4": (
        "ghcr.io/aeon-7/vllm-aeon-ultimate-dflash:qwen36-v4",  # seed 003:25
        {"--max-model-len": "262144"} | speculative(7),  # 003:26 (256K), 003:19 (DFlash at 7 tokens)
        {"--gpu-memory-utilization": "0.8", "--attention-backend": "flash_attn"} | DEFAULT_ON),  # ours; 000:17
    "aeon-gemma4-v2": (
        "ghcr.io/aeon-7/aeon-gemma-4-26b-a4b-dflash:v2",  # seed 003:37
        {"--max-model-len": "32768", "--max-num-seqs": "64"},  # 003:68, 32K x 64
        {"--gpu-memory-utilization": "0.8"} | DEFAULT_ON
        | speculative(10, attention_backend="flash_attn")),  # AEON's recipe
    "aeon-gemma4-v2-262k": (
        "ghcr.io/aeon-7/aeon-gemma-4-26b-a4b-dflash:v2",  # seed 003:37
        {"--max-model-len": "262144"},  # 003:38
        {"--gpu-memory-utilization": "0.8", "--max-num-seqs": "2"} | DEFAULT_ON
        | speculative(10, attention_backend="flash_attn")),
    "aeon-gemma4-v2-nospec": (
        "ghcr.io/aeon-7/aeon-gemma-4-26b-a4b-dflash:v2",  # seed 003:37
        {},  # 003:104, "no-spec": no --speculative-config
        {"--gpu-memory-utilization": "0.8", "--max-model-len": "32768", "--max-num-seqs": "64"} | DEFAULT_ON),
}


@pytest.mark.parametrize("name", sorted(SEED_003))
def test_a_seed_003_stack_renders_what_the_seed_states_and_only_what_is_listed_beyond_it(name: str) -> None:
    image, stated, ours = SEED_003[name]
    stack = CATALOG.stack(name)
    stack = stack.model_copy(update={"switch": stack.switch.model_copy(update={"park": Park.STOP})})
    plan = render(stack, SOURCES)
    placed = {"--served-model-name": stack.served_name, "--host": "127.0.0.1", "--port": str(stack.port)}
    assert (plan.image, plan.command[:2], plan.env) == (image, ("serve", "/model"), {"HF_HUB_OFFLINE": "1"})
    assert flags(plan.command[2:]) == placed | stated | ours


def test_stacks_render_says_what_sparkctl_added_and_why(workspace: Path, cli) -> None:
    code, out, err = cli("stacks", "render", "qwen36-dflash")
    assert code == 0 and "--enable-sleep-mode" in out
    assert "added by sparkctl: --enable-sleep-mode  (switch.park: auto: parks by sleeping" in err
    assert "added by sparkctl: VLLM_SERVER_DEV_MODE=1" in err


def test_diffusiongemmas_compose_command_has_the_seeds_values_and_says_where_each_flag_comes_from() -> None:
    """Seed 003 deployed the upstream compose project: its command is that project's, each flag
    marked seed (with its line), upstream or ours, on its line or the comment just above it."""
    lines = (ROOT / "compose" / "diffusiongemma" / "compose.yml").read_text().splitlines()
    command: dict[str, str] = {}
    for i, line in enumerate(lines):
        if (arg := line.strip()).startswith("- --"):
            flag = arg[2:].split("#")[0].strip()
            said = line.split("#", 1)[1] if "#" in line else lines[i - 1]
            assert re.search(r"seed 003:\d+|upstream|ours", said), f"{flag}: no source"
            name, _, value = flag.partition("=")
            command[name] = value
    assert command["--max-model-len"] == "${MAX_MODEL_LEN:-262144}"  # seed 003:50
    assert command["--max-num-seqs"] == "${MAX_NUM_SEQS:-4}"  # seed 003:66, the stock config
    assert command["--kv-cache-dtype"] == "${KV_CACHE_DTYPE:-fp8_e4m3}"  # seed 003:72


def test_docs_name_everything_the_render_adds_to_the_seeds_values() -> None:
    text = (ROOT / "docs" / "engines.md").read_text()
    section = text.split("### What a rendered command takes from the seeds", 1)[1].split("\n#", 1)[0]
    assert [added for added in SPARKCTL_ADDS if added not in section] == []
