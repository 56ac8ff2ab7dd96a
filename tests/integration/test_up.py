"""`sparkctl up / down / status` end to end on a real dockerd: the sim image pulled by digest
from a loopback registry under its real name, weights from the local Hub, the DSpark overlays
and the shim, phased health; and every failure case ending in one clear message, no stray
container, and the previous deployment still running."""

from __future__ import annotations

import json
import socket
import subprocess
import time
from pathlib import Path

import pytest

from sparkctl.policy.headroom import tokens
from sparkctl.sim.engine import KV_BLOCK_SIZE
from sparkctl.sim.profiles import PROFILES, kv_capacity
from sparkctl.state import desired
from sparkctl.state.journal import Answers
from sparkctl.state.store import Store
from tests.conftest import FAST, instance, name, ours, port, wait_for
from tests.fakes.repos import QWEN_NVFP4

VLLM = "/opt/sim/lib/python3.11/site-packages/vllm"


def stack_file(workspace: Path, name: str, text: str) -> None:
    (workspace / "stacks" / f"{name}.yaml").write_text(f"name: {name}\n{text}")


def kv_tokens_of(profile: str, fraction: float) -> int:
    """The KV capacity the sim reports for a profile and memory fraction: whole blocks."""
    return kv_capacity(PROFILES[profile], fraction) // KV_BLOCK_SIZE * KV_BLOCK_SIZE


def test_up_qwen36_dflash_reaches_canary_with_overlays_and_shim(world, cli, engine) -> None:
    code, out, err = cli("up", "qwen36-dflash")
    assert code == 0, err
    assert f"qwen36-dflash up: http://127.0.0.1:{port(8107)}/v1" in out and "speculative acceptance" in out
    for phase in ("resolving", "pulling", "fetching", "patching", "starting", "loading", "ready", "canary", "running"):
        assert phase in out
    container = engine.client.containers.get(name("qwen36-dflash"))
    mounts = {m["Destination"]: m for m in container.attrs["Mounts"]}
    targets = [f"{VLLM}/v1/spec_decode/dflash.py", f"{VLLM}/model_executor/models/qwen3_dflash.py",
               f"{VLLM}/v1/spec_decode/llm_base_proposer.py"]
    assert all(not mounts[t]["RW"] for t in targets + ["/model", "/draft"])
    dflash = container.exec_run(["cat", targets[0]]).output.decode()
    assert "    _draft_kv_cache_group_ids = ()\n    _draft_layer_to_kv_cache_gid = {}\n" in dflash
    assert 'DSPARK_PATCH = "qwen3_dflash"' in container.exec_run(["cat", targets[1]]).output.decode()
    write = container.exec_run(["sh", "-c", f"echo x >> {targets[0]}"])
    assert write.exit_code != 0 and "Read-only" in write.output.decode()
    env = container.attrs["Config"]["Env"]
    assert "HF_HUB_OFFLINE=1" in env and not any("TOKEN" in e for e in env)
    rendered = json.loads(cli("stacks", "render", "qwen36-dflash", "--format", "json")[1])  # vLLM's dir now known
    assert {m["target"] for m in rendered["mounts"]} >= set(targets)


def test_up_again_is_a_no_op_and_status_shows_it(world, cli, engine) -> None:
    code, out, _ = cli("up", "qwen36-dflash")
    kv = kv_tokens_of("qwen36-dflash-n8", 0.8)
    assert code == 0 and f"qwen36-dflash: {kv / 131072:.1f} full-context requests fit (KV cache {tokens(kv)} tokens, " \
                         "max_model_len 131,072)" in " ".join(out.split())
    started = engine.client.containers.get(name("qwen36-dflash")).attrs["State"]["StartedAt"]
    since = time.time()
    code, out, _ = cli("up", "qwen36-dflash")
    assert code == 0 and "already up, unchanged" in out
    created = engine.client.events(since=since, until=time.time(), decode=True, filters={
        "type": "container", "event": "create", "label": f"sparkctl.instance={instance()}"})
    assert list(created) == []  # the image's files for the patches were read once, by the first `up`
    assert engine.client.containers.get(name("qwen36-dflash")).attrs["State"]["StartedAt"] == started
    code, out, _ = cli("status", "--json")
    [row] = json.loads(out)
    assert (row["stack"], row["phase"], row["memory"]) == ("qwen36-dflash", "running", 0.8)
    assert row["endpoint"] == f"http://127.0.0.1:{port(8107)}/v1" and len(row["fingerprint"]) == 16
    # the KV headroom read when it started, still shown after an `up` that read nothing
    assert row["kv"] == {"kv_tokens": kv, "max_model_len": 131072, "max_num_seqs": None, "min_kv_tokens": None,
                         "full_context": round(kv / 131072, 1), "warnings": [],
                         "summary": f"{kv / 131072:.1f} full-context requests fit (KV cache {tokens(kv)} tokens, "
                                    "max_model_len 131,072)"}
    code, out, _ = cli("logs", "qwen36-dflash", "-n", "5")
    assert "Starting vLLM API server" in out
    code, out, _ = cli("down", "qwen36-dflash")
    assert code == 0 and not ours(engine)
    assert json.loads(cli("status", "--json")[1]) == []


def test_an_unchanged_up_is_found_so_by_the_pipeline_and_a_stopped_engine_starts_again(world, cli, engine) -> None:
    """The pipeline decides an unchanged `up` in one place: its engine step finds the running
    container with the fingerprint just prepared. An edit the engine does not see changes
    nothing; a container stopped behind sparkctl's back is started again."""
    assert cli("up", "qwen36-dflash")[0] == 0
    code, out, _ = cli("up", "qwen36-dflash")
    assert code == 0 and "already up, unchanged" in out, out
    store = Store(world / "state" / "sparkctl.db")
    [latest, previous, *_] = store.deployments.history("qwen36-dflash")
    assert latest.phase == "running" and latest.fingerprint == previous.fingerprint
    assert store.deployments.transitions(latest.id)[-1][2] == "unchanged"
    stack = world / "stacks" / "qwen36-dflash.yaml"
    stack.write_text(stack.read_text() + "# an edit that changes nothing the engine sees\n")
    code, out, _ = cli("up", "qwen36-dflash")
    assert code == 0 and "already up, unchanged" in out, out
    engine.client.containers.get(name("qwen36-dflash")).stop(timeout=0)  # the container stopped behind its back
    code, out, _ = cli("up", "qwen36-dflash")  # the daemon's reconciler starts it again, or the `up` does
    assert code == 0, out
    assert engine.client.containers.get(name("qwen36-dflash")).status == "running"


def test_without_the_shim_the_engine_fails_and_sparkctl_names_the_hint(world, cli, engine) -> None:
    (world / "patches" / "overlays-only.yaml").write_text(
        "name: overlays-only\noverlays:\n"
        "  - {source: 'draft:vllm_patches/qwen3_dflash.py', target: model_executor/models/qwen3_dflash.py}\n"
        "  - {source: 'draft:vllm_patches/llm_base_proposer.py', target: v1/spec_decode/llm_base_proposer.py}\n")
    stack_file(world, "noshim", "extends: qwen36-dflash\npatches: [overlays-only]\n")
    code, _, err = cli("up", "noshim")
    assert code == 1
    assert "AttributeError: 'DFlashProposer' object has no attribute '_draft_kv_cache_group_ids'" in err
    assert "hint: the DFlash 2-line shim is missing" in err
    assert not ours(engine)  # nothing left, and nothing tried again: a failed `up` of a new stack leaves it
    assert "noshim" not in desired.load(world / "state" / "desired.yaml").stacks  # not desired


def test_patch_check_prints_the_diff_without_starting_anything(world, cli, engine) -> None:
    code, out, err = cli("patch", "check", "qwen36-dflash")
    assert code == 0, err
    assert "+    _draft_kv_cache_group_ids = ()" in out and "+    _draft_layer_to_kv_cache_gid = {}" in out
    assert "patches apply: 3 files" in out
    assert not ours(engine)


def test_compose_stack_comes_up_and_down(world, cli, engine, monkeypatch) -> None:
    monkeypatch.setenv("SPARKCTL_HF_TOKEN", "hf_test_token_123")
    code, out, err = cli("up", "diffusiongemma")
    assert code == 0, err + out
    assert f"diffusiongemma up: http://127.0.0.1:{port(8111)}/v1" in out
    [container] = ours(engine)
    info = engine.client.api.inspect_container(container["Id"])
    assert info["Config"]["Labels"]["com.docker.compose.project"] == name("diffusiongemma")
    assert not any("hf_test_token_123" in e for e in info["Config"]["Env"])
    assert "sim profile diffusiongemma" in engine.logs(container["Id"], tail=50)
    monkeypatch.setenv("COLUMNS", "80")
    code, out, _ = cli("status")
    assert f"http://127.0.0.1:{port(8111)}/v1" in out and "0.85" in out  # whole at 80 columns; its share
    kv = kv_tokens_of("diffusiongemma", 0.85)  # at the context and seqs compose ran it with
    assert f"diffusiongemma: {kv / 262144:.1f} full-context requests fit" in " ".join(out.split())
    [row] = json.loads(cli("status", "--json")[1])
    assert (row["kv"]["kv_tokens"], row["kv"]["max_model_len"], row["kv"]["max_num_seqs"]) == (kv, 262144, 4)
    code, out, _ = cli("down", "diffusiongemma")
    assert code == 0 and not ours(engine)


def test_kv_headroom_short_of_the_stack_warns_in_up_status_and_the_daemon_log(world, cli, engine,
                                                                               start_daemon) -> None:
    """Through the daemon: a deploy stands whatever the engine says of its KV cache, and what falls
    short is a warning in `up`'s output, in the daemon's log and in `status`, also once the daemon
    has restarted (the headroom is kept with the deployment)."""
    stack_file(world, "tight", "extends: qwen36-dflash\nvllm: {max_num_seqs: 8}\n"
                               "expectations: {min_kv_tokens: 5000000}\n")
    daemon = start_daemon()
    code, out, err = cli("up", "tight")
    assert code == 0, err + out
    kv, flat = kv_tokens_of("qwen36-dflash-n8", 0.8), " ".join(out.split())
    assert f"warning: only {kv / 131072:.2f} full-context requests fit in the KV cache" in flat
    assert f"max_num_seqs is 8: requests beyond {kv // 131072} at full context will queue" in flat
    assert f"holds {kv:,} tokens, under the stack's expectations.min_kv_tokens 5,000,000" in flat
    logged = [json.loads(line) for line in daemon.logs().splitlines() if '"kv_headroom' in line]
    assert [(e["event"], e["stack"], e["kv_tokens"]) for e in logged] == \
        [("kv_headroom", "tight", kv)] + [("kv_headroom_short", "tight", kv)] * 2
    assert logged[2]["needed"] == 8 * 131072 and logged[2]["level"] == "warning"
    daemon.stop()
    start_daemon()
    [row] = json.loads(cli("status", "--json")[1])
    assert row["kv"]["kv_tokens"] == kv and len(row["kv"]["warnings"]) == 2
    assert " ".join(cli("status")[1].split()).count("warning tight:") == 2


def test_a_compose_file_cannot_hand_the_token_to_its_container(world, cli, engine, monkeypatch) -> None:
    """The compose file asks for the token by every name; sparkctl runs compose with a clean
    environment, so nothing in `docker inspect` of the container holds it."""
    for var in ("SPARKCTL_HF_TOKEN", "HF_TOKEN"):
        monkeypatch.setenv(var, "hf_test_token_123")
    compose = world / "compose" / "diffusiongemma" / "compose.yml"
    compose.write_text(compose.read_text().replace(
        "      VLLM_USE_V2_MODEL_RUNNER: \"1\"\n",
        "      VLLM_USE_V2_MODEL_RUNNER: \"1\"\n"
        "      LEAK_A: ${HF_TOKEN:-none}\n      LEAK_B: ${SPARKCTL_HF_TOKEN:-none}\n"))
    code, out, err = cli("up", "diffusiongemma")
    assert code == 0, err + out
    [container] = ours(engine)
    info = engine.client.api.inspect_container(container["Id"])
    assert "LEAK_A=none" in info["Config"]["Env"] and "LEAK_B=none" in info["Config"]["Env"]
    assert "hf_test_token_123" not in json.dumps(info)


# --- failures: one clear message, nothing half-done ------------------------------------------

def up_ok_then(cli, engine) -> str:
    """Deploy qwen36-dflash; returns its container id, to check it survives what follows."""
    assert cli("up", "qwen36-dflash")[0] == 0
    return engine.client.containers.get(name("qwen36-dflash")).id


def assert_still_running(engine, container_id: str) -> None:
    [c] = [c for c in ours(engine)]
    assert (c["Id"], c["State"]) == (container_id, "running")


def test_a_multi_node_stack_does_not_start_on_one_spark(world, cli, engine) -> None:
    stack_file(world, "group", "extends: qwen36-dflash\nparallel: {tensor: 2, nodes: 2}\n")
    code, _, err = cli("up", "group")
    assert code == 1 and "multi-node stack (2 ranks)" in err and "sparkctl fleet up group" in err
    assert not ours(engine)


def test_blacklisted_tag(world, cli, engine) -> None:
    stack_file(world, "gemma-latest", "extends: aeon-gemma4-v2\nimage:\n  tag: latest\n  allow_latest: true\n")
    code, _, err = cli("up", "gemma-latest")
    [started, error] = err.splitlines()  # the daemon this command started, then one line for the refusal
    assert code == 1 and started.startswith("started the sparkctl daemon")
    assert "blacklisted since 2026-06-10: DFlash acceptance dropped to ~10%" in error
    assert not ours(engine)


def test_moved_tag_is_reported_not_followed(world, cli, engine, published, images) -> None:
    running = up_ok_then(cli, engine)
    tag = "aeon-7/aeon-vllm-ultimate:2026-06-18-v0.23.0-dflashfix"
    published.move_tag(tag, images["sim"], stamp="moved")
    try:
        code, out, _ = cli("up", "qwen36-dflash")
        assert code == 0 and "has moved" not in out  # the registry's answer to the first `up` holds for a minute
        store = Store(world / "state" / "sparkctl.db")
        with store.db.tx() as db:  # a minute later
            db.execute("UPDATE answers SET asked = asked - ?", (Answers.KEPT_S,))
        store.close()
        code, out, _ = cli("up", "qwen36-dflash")
        assert code == 0 and "has moved" in out and "running the pinned digest" in out and "unchanged" in out
        assert_still_running(engine, running)
    finally:  # the registry is the session's: later tests find the tag where `published` put it
        published.push(images["sim"], tag)


def test_gated_repo_without_a_token(world, cli, engine) -> None:
    code, _, err = cli("up", "diffusiongemma")
    assert code == 1 and "gated repo" in err and "SPARKCTL_HF_TOKEN" in err and "HTTP 401" in err
    assert not ours(engine)


def test_disk_too_small(world, cli, engine, tmp_path: Path, monkeypatch) -> None:
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(small)], check=True)
    monkeypatch.setenv("SPARKCTL_HF_CACHE_DIR", str(small / "hub"))
    try:
        code, _, err = cli("up", "qwen36-dflash")
    finally:
        subprocess.run(["umount", str(small)], check=True)
    assert code == 1 and "not enough disk for AEON-7/Qwen3.6-27B-AEON-Ultimate-Uncensored-NVFP4" in err
    assert "GiB free at" in err
    assert not ours(engine)


def test_interrupted_download_resumes(world, cli, engine, hub) -> None:
    weights = b"\x00" * (24 * 2**20)
    hub.hub.repos[QWEN_NVFP4].files["model-00002-of-00002.safetensors"] = weights
    hub.hub.drop_after["model-00002-of-00002.safetensors"] = 15 * 2**20
    try:
        code, _, err = cli("up", "qwen36-dflash")
    finally:
        del hub.hub.repos[QWEN_NVFP4].files["model-00002-of-00002.safetensors"]
    assert code == 0, err
    assert any(r.endswith(f"00002.safetensors bytes={10 * 2**20}-") for r in hub.hub.requests)


def test_patch_target_missing_from_the_image(world, cli, engine) -> None:
    (world / "patches" / "wrong.yaml").write_text(
        "name: wrong\nshims:\n  - file: v1/spec_decode/nope.py\n    class: DFlashProposer\n"
        "    attributes: {x: '()'}\n")
    stack_file(world, "wrong", "extends: qwen36-dflash\npatches: [dspark-dflash, wrong]\n")
    code, _, err = cli("up", "wrong")
    [_started, error] = err.splitlines()
    assert code == 1 and f"patch target {VLLM}/v1/spec_decode/nope.py is missing from the image" in error
    assert not ours(engine)


def test_port_in_use(world, cli, engine) -> None:
    with socket.socket() as busy:
        busy.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        busy.bind(("127.0.0.1", port(8107)))
        busy.listen()
        code, _, err = cli("up", "qwen36-dflash")
    assert code == 1 and "hint: the port is in use" in err and "address already in use" in err
    assert not ours(engine)


@pytest.mark.parametrize(("fault", "words"), [
    ("crash_on_load", "exited with code 1 while loading"),
    ("hang_on_load", "still loading after its 10 s budget"),
])
def test_failed_redeploy_keeps_the_previous_one_running(world, cli, engine, monkeypatch, fault, words) -> None:
    (world / "stacks" / "qwen36-dflash.yaml").write_text(
        (world / "stacks" / "qwen36-dflash.yaml").read_text() + "health:\n  load: 10\n")  # the first up's too
    running = up_ok_then(cli, engine)
    monkeypatch.setenv("SPARKCTL_ENGINE_ENV", f"{FAST},SPARKCTL_SIM_FAULTS={fault}")
    assert cli("daemon", "--stop")[0] == 0  # the next one reads the setting
    code, _, err = cli("up", "qwen36-dflash")
    assert code == 1 and words in err, err
    assert_still_running(engine, running)
    assert engine.client.containers.get(name("qwen36-dflash")).id == running
    monkeypatch.setenv("SPARKCTL_ENGINE_ENV", FAST)
    assert cli("daemon", "--stop")[0] == 0
    code, out, _ = cli("up", "qwen36-dflash")
    assert code == 0 and "unchanged" in out


def test_a_staged_stack_starts_its_engine_only_once_admitted(world, engine) -> None:
    """What a hold/swap switch does with the new stack: staged (prepared, its container started
    with the engine behind a gate) while the old one still runs. Its engine is refused while the
    old one holds the memory (the container goes), and starts in that very container once the old
    one has stopped; a staged stack that will not start is discarded. Started again later, the
    container runs its engine at once."""
    from sparkctl.deploy.health import http_status
    from sparkctl.deploy.progress import RecordingReporter
    from sparkctl.errors import SparkctlError
    from sparkctl.phase import Phase
    from sparkctl.settings import Settings
    from sparkctl.wiring import Wiring

    wiring = Wiring(Settings())
    deployer = wiring.deployer(RecordingReporter())
    deployer.up("qwen36-dflash")  # 0.8 of the memory: aeon-gemma4-v2 (0.8) fits only once it stopped
    latest = wiring.store.deployments.latest
    url = wiring.catalog().stack("aeon-gemma4-v2").url

    staged = deployer.stage("aeon-gemma4-v2")
    [gated] = ours(engine, "aeon-gemma4-v2")
    assert gated["State"] == "running" and http_status(url + "/health") is None  # it runs, not its engine
    with pytest.raises(SparkctlError, match="aeon-gemma4-v2 does not fit"):
        deployer.up("aeon-gemma4-v2", staged=staged)
    assert ours(engine, "aeon-gemma4-v2") == [] and latest("aeon-gemma4-v2").phase is Phase.FAILED

    staged = deployer.stage("aeon-gemma4-v2")
    deployer.discard(staged, "the switch was rolled back")
    assert ours(engine, "aeon-gemma4-v2") == [] and latest("aeon-gemma4-v2").phase is Phase.FAILED

    staged = deployer.stage("aeon-gemma4-v2")
    [gated] = ours(engine, "aeon-gemma4-v2")
    for c in ours(engine, "qwen36-dflash"):
        wiring.docker.stop(c["Id"], timeout=0)
    result = deployer.up("aeon-gemma4-v2", staged=staged)
    assert result.changed and "engine_start_s" in result.timings
    assert [(c["Id"], c["State"]) for c in ours(engine, "aeon-gemma4-v2")] == [(gated["Id"], "running")]
    assert latest("aeon-gemma4-v2").phase is Phase.RUNNING
    wiring.docker.stop(gated["Id"], timeout=0)  # a rollback starts a stopped container again: no gate then
    wiring.docker.start(gated["Id"])
    wait_for(lambda: http_status(url + "/health") == 200, what="the restarted container's engine answers")


def test_an_image_the_disk_cannot_hold_is_refused_before_its_pull(published, tmp_path: Path) -> None:
    """The pull's disk check reads the layers' sizes from the registry's manifest (here the loopback
    registry's), against the free space of Docker's root dir: a 2 MB filesystem stands in for it."""
    from sparkctl.container import EngineFacts
    from sparkctl.deploy.image import room_for
    from sparkctl.deploy.progress import RecordingReporter
    from sparkctl.errors import SparkctlError

    small = tmp_path / "docker-root"
    small.mkdir()

    class Engine:  # the root dir Docker would report, on the small filesystem
        def facts(self) -> EngineFacts:
            return EngineFacts("26", "1.45", ("runc",), str(small))

    from tests.fakes.registry import PUBLISHED

    ref = f"{published.host}/{next(iter(PUBLISHED))}"  # as the mirror serves it
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(small)], check=True)
    try:
        with pytest.raises(SparkctlError, match=r"not enough disk for image .* GB compressed, about .* once extracted"):
            room_for(ref, stack="s", docker=Engine(), reporter=RecordingReporter())
        unreachable = RecordingReporter()
        room_for("127.0.0.1:9/nothing:1", stack="s", docker=Engine(), reporter=unreachable)
        assert "the image's size is unknown" in unreachable.notes[0]  # said, and the pull goes on
    finally:
        subprocess.run(["umount", str(small)], check=True)
