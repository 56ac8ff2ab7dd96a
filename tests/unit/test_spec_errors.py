"""Malformed stack files: each fails with one line naming the file, the key and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest

GOOD = """\
name: mine
extends: qwen36-nvfp4-stock
vllm:
  port: 8199
"""

BASE = "name: a\nextends: qwen36-nvfp4-stock\n"
# (case id, files to write {name: text}, expected key in the message, expected words)
CASES = [
    ("unknown-key", {"a.yaml": "name: a\nextends: qwen36-nvfp4-stock\nvlm:\n  port: 1\n"},
     "vlm", "unknown key; allowed here: abstract, allow, bench_profile"),
    ("unknown-nested-key", {"a.yaml": "name: a\nextends: qwen36-nvfp4-stock\nvllm:\n  max_model_length: 4096\n"},
     "vllm.max_model_length", "allowed here:"),
    ("wrong-type", {"a.yaml": "name: a\nextends: qwen36-nvfp4-stock\nvllm:\n  max_model_len: lots\n"},
     "vllm.max_model_len", "valid integer"),
    ("extends-cycle", {"a.yaml": "name: a\nextends: b\n", "b.yaml": "name: b\nextends: a\n"},
     "extends", "cycle"),
    ("extends-self", {"a.yaml": "name: a\nextends: a\n"}, "extends", "cycle"),
    ("missing-base", {"a.yaml": "name: a\nextends: no-such-stack\n"}, "extends", "no stack named 'no-such-stack'"),
    ("speculative-without-draft",
     {"a.yaml": "name: a\nextends: qwen36-nvfp4-aeon\nvllm:\n  port: 8199\n  speculative:\n"
                "    method: dflash\n    num_speculative_tokens: 8\n"},
     "(top level)", "speculative method 'dflash' needs a `draft`"),
    ("gpu-memory-zero", {"a.yaml": "name: a\nextends: qwen36-nvfp4-stock\nresources:\n  gpu_memory_utilization: 0\n"},
     "resources.gpu_memory_utilization", "greater than 0"),
    ("gpu-memory-above-one",
     {"a.yaml": "name: a\nextends: qwen36-nvfp4-stock\nresources:\n  gpu_memory_utilization: 1.2\n"},
     "resources.gpu_memory_utilization", "less than or equal to 1"),
    ("blacklisted-image",
     {"a.yaml": "name: a\nextends: aeon-gemma4-v2\nimage:\n  tag: latest\n  allow_latest: true\n"},
     "image", "blacklisted since 2026-06-10: DFlash acceptance dropped to ~10%"),
    ("latest-without-opt-in", {"a.yaml": "name: a\nextends: qwen36-nvfp4-stock\nimage:\n  tag: latest\n"},
     "image", "moving tag (latest)"),
    ("untagged-without-opt-in", {"a.yaml": "name: a\nextends: qwen36-nvfp4-stock\nimage:\n  tag: null\n"},
     "image", "moving tag (untagged)"),
    ("duplicate-name", {"a.yaml": "name: qwen36-dflash\nextends: qwen36-nvfp4-stock\n"},
     "name", "already defined in"),
    ("bad-yaml", {"a.yaml": "name: a\nvllm: [unclosed\n"}, "line", "invalid YAML"),
    ("not-a-mapping", {"a.yaml": "- just\n- a list\n"}, "", "holds one mapping"),
    ("missing-name", {"a.yaml": "extends: qwen36-base\n"}, "name", "required"),
    ("bad-name", {"a.yaml": "name: Has Spaces\nextends: qwen36-nvfp4-stock\n"}, "name", "should match pattern"),
    ("unknown-patch-set", {"a.yaml": "name: a\nextends: qwen36-dflash\npatches: [nope]\nvllm:\n  port: 8199\n"},
     "patches", "unknown patch set 'nope'; known: dspark-dflash"),
    ("bad-speculative-method",
     {"a.yaml": "name: a\nextends: qwen36-dflash\nvllm:\n  speculative:\n    method: magic\n"},
     "vllm.speculative.method", "'dflash', 'eagle'"),
    ("weights-both-sources",
     {"a.yaml": "name: a\nextends: qwen36-nvfp4-stock\nmodel:\n  path: /models/x\n"},
     "model", "exactly one of `repo`"),
    ("token-in-env",
     {"a.yaml": "name: a\nextends: qwen36-nvfp4-stock\ncontainer:\n  env:\n    HF_TOKEN: hf_x\n"},
     "container.env", "HF_TOKEN must not be set here"),
    ("bad-digest", {"a.yaml": "name: a\nextends: qwen36-nvfp4-stock\nimage:\n  digest: sha256:abc\n"},
     "image.digest", "should match pattern"),
    ("duplicate-yaml-key", {"a.yaml": "name: a\nname: b\n"}, "line", "invalid YAML"),
    ("compose-without-project", {"a.yaml": "name: a\nkind: compose\nimage:\n  repository: x/y\n  tag: v1\n"},
     "(top level)", "needs `compose`"),
    ("bad-kind", {"a.yaml": "name: a\nkind: k8s\nimage:\n  repository: x/y\n  tag: v1\n"},
     "kind", "'vllm' or 'compose'"),
    ("mount-of-root", {"a.yaml": f"{BASE}container:\n  mounts:\n    - {{source: /, target: /host}}\n"},
     "container.mounts.0.source", "whole host"),
    ("docker-socket-without-opt-in",
     {"a.yaml": f"{BASE}container:\n  mounts:\n    - {{source: /var/run/docker.sock, target: /d.sock}}\n"},
     "(top level)", "add `allow: [docker-socket]`"),
    ("all-interfaces-without-opt-in", {"a.yaml": f"{BASE}vllm:\n  extra_args: [--host, 0.0.0.0]\n"},
     "(top level)", "add `allow: [all-interfaces]`"),
    ("non-loopback-host", {"a.yaml": f"{BASE}vllm:\n  host: 0.0.0.0\n"}, "(top level)", "beyond loopback"),
    ("remote-code-without-opt-in", {"a.yaml": f"{BASE}vllm:\n  extra_args: [--trust-remote-code]\n"},
     "(top level)", "add `allow: [remote-code]`"),
    ("unknown-opt-in", {"a.yaml": f"{BASE}allow: [everything]\n"}, "allow.0", "'docker-socket'"),
    ("compose-project-escapes", {"a.yaml": "name: a\nextends: diffusiongemma\ncompose:\n  project: ../../..\n"},
     "compose.project", "relative path inside"),
    ("compose-project-absolute", {"a.yaml": "name: a\nextends: diffusiongemma\ncompose:\n  project: /etc\n"},
     "compose.project", "relative path inside"),
    ("compose-env-newline",
     {"a.yaml": "name: a\nextends: diffusiongemma\ncompose:\n  env:\n    A: \"x\\nHF_HUB_OFFLINE=0\"\n"},
     "compose.env", "one line"),
]


@pytest.mark.parametrize(("files", "key", "words"), [c[1:] for c in CASES], ids=[c[0] for c in CASES])
def test_malformed_stack_gives_one_clear_line(workspace: Path, cli, files, key, words) -> None:
    for name, text in files.items():
        (workspace / "stacks" / name).write_text(text)
    code, out, err = cli("stacks", "validate")
    assert code == 1, out
    lines = err.strip().splitlines()
    assert len(lines) == 1 and "Traceback" not in err, err
    line = lines[0]
    assert line.startswith("error: ") and ".yaml" in line, line
    assert f": {key}" in line if key else True, line
    assert words in line, line


def test_validate_a_good_extra_file(workspace: Path, cli, tmp_path: Path) -> None:
    extra = tmp_path / "elsewhere" / "mine.yaml"
    extra.parent.mkdir()
    extra.write_text(GOOD)
    code, out, err = cli("stacks", "validate", str(extra))
    assert (code, err) == (0, "")
    assert "1 stacks valid" in out


def test_the_shipped_stacks_are_valid(workspace: Path, cli) -> None:
    code, out, err = cli("stacks", "validate")
    assert (code, err) == (0, "")
    stacks = [p for p in (workspace / "stacks").glob("*.yaml") if p.name != "images.yaml"]
    shipped = len([p for p in stacks if "abstract: true" not in p.read_text()])
    assert f"{shipped} stacks valid" in out


def test_an_opted_in_risk_loads_and_says_so(workspace: Path, cli) -> None:
    (workspace / "stacks" / "a.yaml").write_text(
        f"{BASE}allow: [all-interfaces]\nvllm:\n  extra_args: [--host, 0.0.0.0]\n")
    code, out, err = cli("stacks", "validate")
    assert code == 0, err
    assert "warning: a: vllm.host / extra_args: the engine listens beyond loopback" in out


def test_a_speculative_max_model_len_is_flagged_as_ignored_with_the_routed_alias_to_use(workspace: Path, cli) -> None:
    (workspace / "stacks" / "a.yaml").write_text(
        "name: a\nextends: qwen36-dflash\nvllm:\n  port: 8198\n  speculative: {max_model_len: 8192}\n")
    code, out, err = cli("stacks", "validate")
    assert code == 0, err
    said = " ".join(out.split())
    assert "warning: a: vllm.speculative.max_model_len (8192) has no effect on vLLM V1" in said
    assert "`sparkctl route set ALIAS a:8192 <a no-spec stack>`" in said
