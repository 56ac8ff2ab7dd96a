"""`sparkctl stacks show` says what the gateway does with a stack (which caps it enforces, which
are advice, the request defaults); `sparkctl stacks render` prints every mount the deploy makes,
the patch sets' overlays and shims included, with placeholders for what only the image tells."""

from __future__ import annotations

import json
from pathlib import Path

VLLM = "/usr/local/lib/python3.12/site-packages/vllm"
PATCHED = ["model_executor/models/qwen3_dflash.py", "v1/spec_decode/dflash.py", "v1/spec_decode/llm_base_proposer.py"]
DIGEST = "sha256:" + "ab" * 32


def test_show_says_which_caps_the_gateway_enforces(workspace: Path, cli) -> None:
    (workspace / "stacks" / "mine.yaml").write_text(json.dumps({
        "name": "mine", "extends": "qwen36-nvfp4-stock", "vllm": {"port": 8190},
        "known_issues": [
            {"text": "Crashes with 3+ concurrent requests.", "max_concurrency": 2, "source": "seed 003:12"},
            {"text": "Said to hang at 2.", "max_concurrency": 1},
            {"text": "Hangs at 2 here, I am sure.", "max_concurrency": 1, "enforce": True},
            {"text": "Slow past 8k context."}],
        "request_defaults": {"chat_template_kwargs": {"enable_thinking": True}}}))
    code, out, _ = cli("stacks", "show", "mine")
    lines = [line for line in out.splitlines() if line.startswith("# ")][1:]
    assert code == 0 and lines == [
        "# gateway: at most 1 request(s) at once to this stack",
        '# known issue 1, "Crashes with 3+ concurrent requests.": cap 2, enforced by the gateway (source: seed 003:12)',
        '# known issue 2, "Said to hang at 2.": cap 1, advice only (unsourced: set `enforce: true` to enforce)',
        '# known issue 3, "Hangs at 2 here, I am sure.": cap 1, enforced by the gateway (unsourced; `enforce: true`)',
        '# known issue 4, "Slow past 8k context.": no cap; unsourced',
        '# request defaults (added to each request unless the client sets them): '
        '{"chat_template_kwargs": {"enable_thinking": true}}',
        "# memory: the engine's KV cache is given in bytes at deploy (--kv-cache-memory-bytes: the fraction of the "
        "usable memory less the weights and SPARKCTL_ENGINE_OVERHEAD_GIB); `stacks render` shows it"]


def test_show_a_stack_the_gateway_passes_through(workspace: Path, cli) -> None:
    code, out, _ = cli("stacks", "show", "qwen36-nvfp4-stock")
    assert code == 0 and out.splitlines()[-3:-1] == ["# gateway: no concurrency cap", "# request defaults: none"]
    assert out.splitlines()[-1].startswith("# memory: the engine's KV cache is given in bytes")


def test_render_mounts_every_patched_file_with_placeholders(workspace: Path, cli) -> None:
    code, out, err = cli("stacks", "render", "qwen36-dflash", "--format", "json")
    mounts = {m["target"]: m for m in json.loads(out)["mounts"]}
    for rel in PATCHED:
        mount = mounts[f"<vLLM package dir in the image, found at deploy>/{rel}"]
        assert mount["read_only"]
        assert mount["source"].endswith(f"/<hash of the patched files, computed at deploy>/{rel}")
        assert mount["source"].startswith(str(workspace / "state" / "overlays"))
    assert code == 0 and "`sparkctl patch check qwen36-dflash` shows them" in err
    code, out, _ = cli("stacks", "render", "qwen36-dflash")
    assert code == 0 and out.count("<vLLM package dir in the image, found at deploy>/") == 3


def test_render_shows_vllms_dir_once_a_deploy_found_it_in_the_pinned_image(workspace: Path, cli) -> None:
    (workspace / "stacks" / "mine.yaml").write_text(json.dumps({
        "name": "mine", "extends": "qwen36-dflash", "vllm": {"port": 8191}, "image": {"digest": DIGEST}}))
    (workspace / "state").mkdir(exist_ok=True)
    (workspace / "state" / "vllm-dirs.json").write_text(json.dumps({DIGEST: VLLM}))
    code, out, _ = cli("stacks", "render", "mine", "--format", "json")
    targets = {m["target"] for m in json.loads(out)["mounts"]}
    assert code == 0 and {f"{VLLM}/{rel}" for rel in PATCHED} <= targets


def test_a_stack_without_patches_renders_no_placeholder(workspace: Path, cli) -> None:
    code, out, err = cli("stacks", "render", "qwen36-nvfp4-stock")
    assert code == 0 and "<" not in out and "patch check" not in err
