"""A first `up` fetches the image, the model and the draft at once, through a slow link to the Hub
(`tests/fakes/throttle.py`): a stream that fails stops the others at once, and so does a `down`
while they run; nothing is recorded as running, and the next `up` fetches none of the files that
arrived whole (huggingface_hub 2 keeps no partial file: one cut part way comes again whole)."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading

from sparkctl.cli.client import DaemonClient
from sparkctl.phase import Phase
from sparkctl.state import desired
from sparkctl.state.store import Store
from tests.conftest import name, ours, wait_for


def arrived(world) -> bool:
    """Whether the model's slow file is complete in the HF cache (a snapshot links it only then)."""
    return any((world / "hf").rglob("snapshots/*/model-slow.safetensors"))


def test_a_failing_stream_stops_the_others_at_once(world, slow_hub, cli, engine) -> None:
    stack = world / "stacks" / "qwen36-dflash.yaml"
    text = stack.read_text()
    draft = text.index("draft:")
    stack.write_text(text[:draft] + text[draft:].replace("  revision: main", "  revision: no-such-revision", 1))
    code, _, err = cli("up", "qwen36-dflash")
    assert code == 1 and "no such revision" in err, err
    assert not arrived(world) and not ours(engine)  # the model's ~20 s download did not run to its end
    history = Store(world / "state" / "sparkctl.db").deployments.history("qwen36-dflash")
    assert any(d.phase == Phase.FAILED and "no such revision" in (d.error or "") for d in history)  # (it retries)
    stack.write_text(text)
    code, out, err = cli("up", "qwen36-dflash")
    assert code == 0, err


def test_a_down_while_fetching_stops_every_stream_and_the_next_up_keeps_what_arrived(world, slow_hub, cli, engine, hub
                                                                            ) -> None:
    up = subprocess.Popen([sys.executable, "-m", "sparkctl", "up", "qwen36-dflash"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    store = Store(world / "state" / "sparkctl.db")

    def fetching() -> bool:
        latest = store.deployments.latest("qwen36-dflash") if (world / "state" / "sparkctl.db").exists() else None
        return latest is not None and latest.phase in (Phase.PULLING, Phase.FETCHING)

    def whole() -> set[str]:  # the files that arrived whole, as "/repo/file"
        return {f"/{f.parents[2].name.removeprefix('models--').replace('--', '/')}/{f.name}"
                for f in (world / "hf").rglob("snapshots/*/*") if f.is_file()}

    wait_for(fetching, timeout=60, what="the up fetching")
    wait_for(lambda: list((world / "hf").rglob("*.incomplete")) and whole(), timeout=30,
             what="the model's download under way, and a small file arrived whole")
    code, out, err = cli("down", "qwen36-dflash")
    assert code == 0, err
    out, err = up.communicate(timeout=60)
    assert up.returncode == 1 and "stopped" in err, err
    assert not arrived(world) and not ours(engine)  # the download stopped part way
    kept = whole()
    asked = len(hub.hub.requests)
    code, out, err = cli("up", "qwen36-dflash")
    assert code == 0, err
    fetched = [r for r in hub.hub.requests[asked:] if r.startswith("GET") and "/resolve/" in r]
    again = [r for r in fetched if r.split()[1].split("/resolve/")[0] + "/" + r.split()[1].rsplit("/", 1)[-1] in kept]
    assert kept and not again, (kept, again)
    assert any("model-slow.safetensors" in r for r in fetched)  # cut part way: fetched again, whole


def test_a_pulled_stack_shows_fetched_and_its_up_fetches_nothing(world, cli, engine, hub) -> None:
    code, out, err = cli("pull", "qwen36-dflash")
    assert code == 0 and "qwen36-dflash fetched (fingerprint " in out, err
    assert not ours(engine)  # nothing started
    code, out, _ = cli("status", "--json")
    [row] = [r for r in json.loads(out) if r["stack"] == "qwen36-dflash"]
    assert row["phase"] == "fetched" and not row["desired"]
    asked = len(hub.hub.requests)
    code, out, err = cli("up", "qwen36-dflash")
    assert code == 0 and "qwen36-dflash up: http://127.0.0.1:" in out, err
    assert not [r for r in hub.hub.requests[asked:] if r.startswith("GET") and "/resolve/" in r]  # all here
    assert engine.client.api.inspect_container(name("qwen36-dflash"))["State"]["Running"]


def test_ctrl_c_of_an_up_stops_its_fetch_in_the_daemon_and_leaves_the_stack_as_it_was(world, slow_hub, cli,
                                                                                         engine) -> None:
    up = subprocess.Popen([sys.executable, "-m", "sparkctl", "up", "qwen36-dflash"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True,  # as from a terminal: a job a script started in
                          preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))  # the background ignores it
    wait_for(lambda: list((world / "hf").rglob("*.incomplete")), timeout=60, what="the model's download under way")
    up.send_signal(signal.SIGINT)
    out, err = up.communicate(timeout=60)
    assert up.returncode == 130 and "up qwen36-dflash: cancelled: it stopped: " in err, err
    store = Store(world / "state" / "sparkctl.db")
    wait_for(lambda: store.deployments.latest("qwen36-dflash").phase == Phase.FAILED, timeout=60,
             what="the daemon's deploy ended")  # within a progress step, not the ~20 s the download had left
    assert not arrived(world) and not ours(engine)
    code, out, _ = cli("status", "--json")
    assert not [r for r in json.loads(out) if r["stack"] == "qwen36-dflash" and r["desired"]]  # new: not kept


def test_ctrl_c_of_a_patch_check_stops_its_fetch_in_the_daemon(world, slow_hub, engine) -> None:
    """`patch check` fetches in the daemon, as `up` does (not in the CLI's process, out of the
    stack's turn and of reach of a cancel), and a Ctrl-C stops it there, part way."""
    check = subprocess.Popen([sys.executable, "-m", "sparkctl", "patch", "check", "qwen36-dflash"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                             preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    wait_for(lambda: list((world / "hf").rglob("*.incomplete")), timeout=60, what="the model's download under way")
    check.send_signal(signal.SIGINT)
    out, err = check.communicate(timeout=60)
    assert check.returncode == 130 and "patch-check qwen36-dflash: cancelled: it stopped: " in err, err
    assert not arrived(world) and not ours(engine)  # the ~20 s download ended within a progress step


def test_a_down_while_a_patch_check_fetches_stops_it(world, slow_hub, cli, engine) -> None:
    """A `down` (and so the daemon's stop) ends a patch check's fetch as it ends an `up`'s, rather
    than waiting in the stack's turn for every byte."""
    check = subprocess.Popen([sys.executable, "-m", "sparkctl", "patch", "check", "qwen36-dflash"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_for(lambda: list((world / "hf").rglob("*.incomplete")), timeout=60, what="the model's download under way")
    code, _, err = cli("down", "qwen36-dflash")
    assert code == 0, err
    out, err = check.communicate(timeout=60)
    assert check.returncode == 1 and "stopped" in err, err
    assert not arrived(world) and not ours(engine)


def test_ctrl_c_of_a_queued_pull_cancels_that_pull_alone_and_the_up_before_it_runs_on(world, slow_hub, cli,
                                                                                     engine) -> None:
    """The audit's case, two clients on one stack: A's `up` fetches through the slow link, B's
    `pull` waits for its turn and gets a Ctrl-C. B leaves the queue: its CLI says so once the
    daemon confirmed, and it never runs; A's `up` is not stopped and runs to its end."""
    sparkctl = [sys.executable, "-m", "sparkctl"]
    up = subprocess.Popen([*sparkctl, "up", "qwen36-dflash"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                          text=True)
    wait_for(lambda: list((world / "hf").rglob("*.incomplete")), timeout=60, what="the up's model download under way")
    pull = subprocess.Popen([*sparkctl, "pull", "qwen36-dflash"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL))
    said: list[str] = []
    reader = threading.Thread(target=lambda: [said.append(line) for line in pull.stdout])
    reader.start()
    wait_for(lambda: any("waiting for its turn" in line for line in said), timeout=60,
             what="the pull queued behind the up")
    assert not arrived(world)  # the up still fetches
    pull.send_signal(signal.SIGINT)
    assert pull.wait(timeout=60) == 130
    reader.join(10)
    err = pull.stderr.read()
    assert "pull qwen36-dflash: cancelled: it left the queue before its turn: it did not run" in err, err
    out, err = up.communicate(timeout=120)
    assert up.returncode == 0 and "qwen36-dflash up: http://127.0.0.1:" in out, err
    assert arrived(world)
    code, out, err = cli("pull", "qwen36-dflash")  # queued after B's place: B would have run before it
    assert code == 0, err
    history = Store(world / "state" / "sparkctl.db").deployments.history("qwen36-dflash")
    assert sorted(d.phase for d in history) == sorted([Phase.RUNNING, Phase.FETCHED]), history  # A's, then this one


def test_the_daemons_stop_ends_an_up_fetching_and_keeps_its_stack_desired_for_the_next(world, slow_hub,
                                                                                        engine) -> None:
    """Unlike a cancel, the daemon's stop (SIGTERM) ends an `up` part way without undoing it: the
    stack stays desired, for the next daemon to deploy."""
    up = subprocess.Popen([sys.executable, "-m", "sparkctl", "up", "qwen36-dflash"], stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    wait_for(lambda: list((world / "hf").rglob("*.incomplete")), timeout=60, what="the up's model download under way")
    assert DaemonClient(world / "state" / "sparkctl.sock").stop() is not None
    out, err = up.communicate(timeout=60)
    assert up.returncode == 1, err
    assert not arrived(world) and not ours(engine)
    assert "qwen36-dflash" in desired.load(world / "state" / "desired.yaml").stacks
