"""Safe beside a live Spark. An "owner" instance (its own daemon, a stack serving its gateway)
and a plain container that is not sparkctl's run while a second instance does everything the
suite and the demo do: up, switch, a crash loop, down, and their cleanup. The owner's container
keeps its id, start time and restart count, and its gateway never fails a request. Also: two
concurrent `up`s see only their own progress, and containers made before instances are adopted
by the default instance, never removed."""

from __future__ import annotations

import os
import shutil
import threading

import openai
import pytest

from sparkctl.adapters.docker import DockerEngine
from sparkctl.cli.client import DaemonClient
from tests.conftest import BASE_IMAGE, TEST_LABEL, instance
from tests.fakes import sandbox
from tests.integration.conftest import SMALL, DaemonProcess, wait_for

STEADY = "name: steady\nextends: qwen36-nvfp4-stock\n" + SMALL
SPARE = "name: spare\nextends: qwen36-nvfp4-aeon\n" + SMALL
CRASHY = ("name: crashy\nextends: qwen36-nvfp4-stock\ncontainer:\n  env:\n    SPARKCTL_SIM_FAULTS: crash_after=0\n"
          + SMALL)


@pytest.fixture
def owner(world, tmp_path_factory):
    """The Spark owner's installation: another instance on its own ports, serving `steady` as
    `primary` through its own gateway, started before the test's instance does anything."""
    root = tmp_path_factory.mktemp("owner")
    shutil.copytree(world / "stacks", root / "stacks")
    (root / "stacks" / "steady.yaml").write_text(STEADY)
    (root / "state").mkdir()
    (root / "state" / "desired.yaml").write_text("stacks: [steady]\naliases: {primary: steady}\n")
    env = {**os.environ, **sandbox.environment("live", beside=dict(os.environ)),
           "SPARKCTL_STATE_DIR": str(root / "state"), "SPARKCTL_STACKS_DIR": str(root / "stacks"),
           "SPARKCTL_HF_CACHE_DIR": str(root / "hf")}
    daemon = DaemonProcess(root / "state", env)
    daemon.gateway = f"http://127.0.0.1:{env['SPARKCTL_GATEWAY_PORT']}/v1"
    daemon.instance = env["SPARKCTL_INSTANCE"]
    wait_for(lambda: _answers(daemon.gateway), timeout=90, what="the owner's gateway", logs=daemon.logs)
    yield daemon
    daemon.stop()
    sandbox.remove(daemon.instance)


def test_a_second_instance_never_touches_the_owners_stacks(owner, start_daemon, world, cli, engine,
                                                           run_id, monkeypatch) -> None:
    plain = engine.client.containers.run(BASE_IMAGE, ["sleep", "infinity"], detach=True, network_mode="none",
                                         labels={TEST_LABEL: run_id})
    [live] = DockerEngine(instance=owner.instance).containers()
    before = {c: _identity(engine, c) for c in (live.id, plain.id)}
    load = _Load(owner.gateway)
    with load:
        wait_for(lambda: load.ok or load.failed, timeout=30, what="the owner's agent answered before we start")
        for name, text in (("steady", STEADY), ("spare", SPARE), ("crashy", CRASHY)):
            (world / "stacks" / f"{name}.yaml").write_text(text)
        (world / "state").mkdir(exist_ok=True)
        (world / "state" / "desired.yaml").write_text(
            "stacks: [steady, crashy]\naliases: {primary: crashy}\nfallbacks: {primary: steady}\n")
        ours = start_daemon()
        wait_for(lambda: any(r["failed"] for r in ours.client.get("/v1/status")["stacks"]), timeout=90,
                 what="the crash loop", logs=ours.logs)
        for args in (("down", "crashy"), ("up", "spare"), ("switch", "primary", "spare"), ("status",),
                     ("down", "steady"), ("down", "spare")):
            code, out, err = cli(*args)
            assert code == 0, (args, out, err)
            if args == ("status",):  # (a real owner's stacks may be listed too)
                others = out.partition("other sparkctl instances on this engine (not touched): ")[2]
                assert f"{owner.instance}: steady" in others, out
        ours.stop()
        assert sandbox.remove(instance()) == 0  # the suite's and the demo's cleanup: nothing of ours is left
        after = load.ok  # the owner's gateway keeps answering after all of it
        wait_for(lambda: load.ok >= after + 3 or load.failed, timeout=30, what="the owner's agent answered after")
    assert {c: _identity(engine, c) for c in before} == before
    assert load.failed == 0 and load.ok >= after + 3, load.errors[:3]  # answered before, throughout and after


def test_concurrent_ups_each_see_only_their_own_progress(start_daemon, world) -> None:
    for name, text in (("steady", STEADY), ("spare", SPARE)):
        (world / "stacks" / f"{name}.yaml").write_text(text)
    daemon = start_daemon()
    seen: dict[str, list[dict]] = {}

    def up(stack: str) -> None:
        seen[stack] = list(DaemonClient(daemon.state_dir / "sparkctl.sock").stream("/v1/up", {"stack": stack}))

    threads = [threading.Thread(target=up, args=(s,)) for s in ("steady", "spare")]
    for t in threads:
        t.start()
    for t in threads:
        t.join(120)
    assert set(seen) == {"steady", "spare"}
    for stack, events in seen.items():
        assert events[-1]["kind"] == "outcome" and events[-1]["ok"], events[-1]
        assert {e["stack"] for e in events} == {stack}, stack
    # Both fetch the same model repo: whichever downloads it reports progress, to its own client only.
    assert any(e["kind"] == "progress" for events in seen.values() for e in events)


def test_containers_from_before_instances_are_adopted_by_the_default_instance(world, engine, run_id) -> None:
    old = engine.client.containers.create(BASE_IMAGE, ["true"], labels={"sparkctl.stack": "legacy", TEST_LABEL: run_id})
    mine = {c.id for c in DockerEngine().containers(**{TEST_LABEL: run_id})}
    assert old.id in mine  # the default instance sees it as its own
    assert not DockerEngine(instance=instance()).containers(**{TEST_LABEL: run_id})
    assert old.id in {c.id for c in DockerEngine(instance=instance()).others()}


def _identity(engine, container: str) -> tuple:
    state = engine.client.api.inspect_container(container)
    return state["Id"], state["State"]["Status"], state["State"]["StartedAt"], state["RestartCount"]


def _answers(gateway: str) -> bool:
    try:
        _ask(gateway)
    except openai.OpenAIError:
        return False
    return True


def _ask(gateway: str) -> None:
    client = openai.OpenAI(base_url=gateway, api_key="x", max_retries=0, timeout=30)
    client.chat.completions.create(model="primary", messages=[{"role": "user", "content": "hi"}], max_tokens=4)


class _Load:
    """The owner's agent: one request after another to its gateway while the block runs."""

    def __init__(self, gateway: str) -> None:
        self.gateway, self.ok, self.failed, self.errors = gateway, 0, 0, []
        self.stop = threading.Event()

    def __enter__(self) -> _Load:
        self.thread = threading.Thread(target=self._run)
        self.thread.start()
        return self

    def __exit__(self, *_: object) -> None:
        self.stop.set()
        self.thread.join(60)

    def _run(self) -> None:
        while not self.stop.is_set():
            try:
                _ask(self.gateway)
                self.ok += 1
            except openai.OpenAIError as e:
                self.failed += 1
                self.errors.append(repr(e))
            self.stop.wait(0.05)


def test_scratch_containers_carry_the_instance_and_a_daemon_removes_its_leftovers(world, engine, run_id) -> None:
    """A daemon killed while it read files out of an image left an unlabelled container behind for
    good; now it is the instance's, and the next daemon removes it."""
    mine = DockerEngine(instance=instance())
    mine.read_files(BASE_IMAGE, ["/etc/hostname"])  # creates and removes one
    left = engine.client.containers.create(BASE_IMAGE, ["true"], labels=mine._scratch)  # as a kill would leave it
    others = engine.client.containers.create(BASE_IMAGE, ["true"], labels={**DockerEngine(instance="x")._scratch,
                                                                            TEST_LABEL: run_id})
    assert mine.remove_scratch() == 1
    assert left.id not in {c.id for c in engine.client.containers.list(all=True)}
    assert others.id in {c.id for c in engine.client.containers.list(all=True)}
