"""Whatever a stack file says without an `allow:`, its engine gets no way to the Docker socket,
on a real dockerd: a field that would mount the host's /run (as the draft, as the root, through
/proc/self/root or a link, through a compose project's own variable), replace sparkctl's compose
variables, inject keys into the override file, wrap the entrypoint or hand vLLM flags no check
reads is refused before anything is created; a stack within the rules starts, given the paths as
the host resolved them, and its engine finds no socket anywhere in its filesystem."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from tests.conftest import HUB_TOKEN, name, ours

# (what the stack file adds to a shipped stack, words of the one-line refusal)
REFUSED = [
    ("extends: qwen36-dflash\npatches: []\ndraft: {repo: null, path: /run}\n",
     "draft.path: /run is or holds the host's /run"),
    ("extends: qwen36-nvfp4-stock\nmodel: {repo: null, path: /}\n", "model.path: / is or holds the host's"),
    ("extends: qwen36-nvfp4-stock\ncontainer: {mounts: [{source: /proc/self/root/run, target: /host}]}\n",
     "container.mounts[0].source: /proc/self/root/run (on this host: /run) is or holds the host's /run"),
    ("extends: qwen36-nvfp4-stock\ncontainer: {mounts: [{source: /proc/self/root/var/run, target: /host}]}\n"
     "allow: [host-path]\n", "(on this host: /run) is or holds the host's /run"),
    ("extends: diffusiongemma\ncompose: {env: {COMPILE_CACHE: /run}}\n", "COMPILE_CACHE is set by sparkctl itself"),
    ("extends: diffusiongemma\ncompose: {env: {HOST: 0.0.0.0}}\n", "HOST is set by sparkctl itself"),
    ("extends: diffusiongemma\ncompose: {env: {BASE_IMAGE: 'docker:cli'}}\n", "BASE_IMAGE is set by sparkctl itself"),
    ('extends: diffusiongemma\ncompose: {service: "vllm:\\n    privileged: true\\n    volumes: [\'/:/host\']\\n  x"}\n',
     "compose.service"),
    ("extends: qwen36-nvfp4-stock\ncontainer: {entrypoint: [/bin/sh, -c, 'exec vllm \"$@\" --host 0.0.0.0', sh]}\n",
     "add `allow: [entrypoint]`"),
    ("extends: qwen36-nvfp4-stock\nvllm: {extra_args: [--config, /model/flags.yaml]}\n", "--config makes vLLM read"),
    ("extends: qwen36-nvfp4-stock\ncontainer: {env: {VLLM_SERVER_DEV_MODE: '1'}}\n",
     "VLLM_SERVER_DEV_MODE is set by sparkctl itself"),
    ("extends: qwen36-nvfp4-stock\ncontainer: {env: {VLLM_ALLOW_RUNTIME_LORA_UPDATING: '1'}}\n",
     "add `allow: [vllm-env]`"),
]


def test_no_stack_field_mounts_the_hosts_run_or_replaces_what_sparkctl_sets(world, cli, engine) -> None:
    (world / "weights").symlink_to("/run")
    cases = [*REFUSED, (f"extends: qwen36-nvfp4-stock\nmodel: {{repo: null, path: {world}/weights}}\n"
                        "allow: [host-path]\n", f"model.path: {world}/weights (on this host: /run) is or holds")]
    for i, (text, words) in enumerate(cases):
        (world / "stacks" / f"bad{i}.yaml").write_text(f"name: bad{i}\n{text}")
        code, out, err = cli("up", f"bad{i}")
        assert code == 1 and words in " ".join(err.split()), f"case {i}: {text}\n{err}{out}"
        assert not ours(engine), f"case {i} created a container: {text}"


def test_a_stack_within_the_rules_starts_on_the_paths_the_host_resolved(world, cli, engine, tiny_model_dir) -> None:
    (world / "weights").symlink_to(tiny_model_dir)
    (world / "data" / "set").mkdir(parents=True)
    (world / "stacks" / "local.yaml").write_text(
        f"name: local\nextends: qwen36-nvfp4-stock\nmodel: {{repo: null, path: {world}/weights}}\n"
        f"vllm: {{served_model_name: tiny}}\nswitch: {{bench: 'off'}}\nallow: [host-path]\n"
        f"container: {{mounts: [{{source: '{world}/data/./set/', target: /data}}]}}\n")
    code, out, err = cli("up", "local")
    assert code == 0, err + out
    [container] = ours(engine, "local")
    mounts = {m["Destination"]: m for m in engine.client.api.inspect_container(container["Id"])["Mounts"]}
    assert mounts["/model"]["Source"] == os.path.realpath(tiny_model_dir)
    assert mounts["/data"]["Source"] == str(world / "data" / "set")
    cache = Path(mounts["/root/.cache/vllm"]["Source"])
    assert cache.is_relative_to(world / "state") and mounts["/root/.cache/vllm"]["RW"]
    found = engine.client.containers.get(container["Id"]).exec_run(
        ["sh", "-c", "find / \\( -path /proc -o -path /sys \\) -prune -o -type s -print"])
    assert found.exit_code == 0 and found.output.decode().split() == []  # no socket: the Docker one least of all


def test_a_compose_projects_binds_are_judged_as_compose_resolves_them(world, cli, engine, monkeypatch) -> None:
    """A project whose compose file mounts a variable of its own: the stack's `compose.env` may
    set it (it is not sparkctl's), and the bind it makes is judged after compose has read it."""
    monkeypatch.setenv("SPARKCTL_HF_TOKEN", HUB_TOKEN)  # the shipped project's weights are gated
    project = world / "compose" / "extra"
    shutil.copytree(world / "compose" / "diffusiongemma", project)
    text = (project / "compose.yml").read_text()
    cache = "      - ${COMPILE_CACHE:-./models/vllm-cache}:/root/.cache/vllm\n"
    (project / "compose.yml").write_text(text.replace(cache, cache + "      - ${DATA:-./data}:/data:ro\n"))
    for i, data in enumerate(["/run", "/proc/self/root/run", "/var/run/.."]):
        (world / "stacks" / f"extra{i}.yaml").write_text(
            f"name: extra{i}\nextends: diffusiongemma\ncompose: {{project: extra, env: {{DATA: '{data}'}}}}\n")
        code, out, err = cli("up", f"extra{i}")
        flat = " ".join(err.split())
        assert code == 1 and "compose project extra, service vllm, volume at /data:" in flat, err + out
        assert "which sparkctl never mounts" in flat, err
        assert not engine.client.api.containers(all=True, filters={"label": f"com.docker.compose.project="
                                                                            f"{name(f'extra{i}')}"})
