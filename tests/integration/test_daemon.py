"""The daemon on a real dockerd with the sim engine: adoption, crash restarts, crash loops with
alias fallback, `kill -9` of the daemon mid-deploy, concurrent CLI calls, and bad API input.
Each test asserts convergence and that nothing is lost."""

from __future__ import annotations

import http.client
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import docker
import pytest

from sparkctl.adapters.docker import DockerEngine
from sparkctl.cli.client import DaemonClient
from sparkctl.errors import SparkctlError
from sparkctl.state.store import Store
from tests import teardown
from tests.conftest import instance, name
from tests.fakes.repos import QWEN_NVFP4
from tests.integration.conftest import SMALL, DaemonProcess, containers, wait_for


def started_at(engine, name: str) -> str:
    return engine.client.api.inspect_container(name)["State"]["StartedAt"]


def fresh_cli(*args: str) -> str:
    """`sparkctl ARGS` in a new process, its output ending with the exit code and whether it loaded
    a library a call the daemon answers has no use for: the Docker SDK (the settings it reads)."""
    probe = ("import sys; from sparkctl.cli.app import main; code = main(sys.argv[1:]); "
             "print(code, [m for m in ('docker',) if m in sys.modules])")
    return subprocess.run([sys.executable, "-c", probe, *args], env=os.environ, capture_output=True, text=True).stdout


def test_socket_is_private_and_up_goes_through_the_daemon(start_daemon, world, cli, engine) -> None:
    daemon = start_daemon()
    assert daemon.client.get("/v1/stacks")["stacks"] and "qwen36-dflash" in cli("stacks", "list")[1]
    assert (world / "state" / "sparkctl.sock").stat().st_mode & 0o777 == 0o600
    code, out, err = cli("up", "qwen36-dflash")
    assert code == 0 and "qwen36-dflash up: http://127.0.0.1:" in out and "resolving" in out, err
    assert daemon.client.get("/v1/desired")["stacks"] == ["qwen36-dflash"]
    out = fresh_cli("up", "qwen36-dflash")  # again: the pipeline in the daemon finds it unchanged
    assert "already up, unchanged" in out and "starting" not in out and out.rstrip().endswith("0 []"), out
    assert fresh_cli("status").rstrip().endswith("0 []")
    store = Store(world / "state" / "sparkctl.db")
    assert store.deployments.transitions(store.deployments.latest("qwen36-dflash").id)[-1][2] == "unchanged"
    code, out, _ = cli("status", "--json")
    [row] = json.loads(out)
    assert row["stack"] == "qwen36-dflash" and row["desired"] and row["phase"] == "running"
    listening = [line.split()[3] for line in subprocess.run(["ss", "-ltnpH"], capture_output=True,
                                                            text=True).stdout.splitlines()
                 if f"pid={daemon.proc.pid}," in line]
    assert listening == [f"127.0.0.1:{os.environ['SPARKCTL_GATEWAY_PORT']}"]  # the gateway only; no TCP API


def test_a_command_without_a_daemon_starts_one_that_outlives_it(world, engine) -> None:
    """Deploys run in the daemon only: two commands that find none start one between them, detached
    (it outlives them); `daemon --stop` ends it, its stack keeps running, and the next command's
    daemon adopts it."""
    def sparkctl(*args: str) -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "sparkctl", *args], stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, text=True)

    both = [sparkctl("status", "--json"), sparkctl("status", "--json")]
    answers = [(p.communicate(timeout=120), p.returncode) for p in both]
    assert [(json.loads(out), code) for (out, _), code in answers] == [([], 0), ([], 0)], answers
    said = [err for (_, err), _ in answers if "started the sparkctl daemon" in err]
    client = DaemonClient(world / "state" / "sparkctl.sock")
    pid = client.holder()
    assert len(said) == 1 and f"(pid {pid}, log {world / 'state' / 'daemon.log'})" in said[0], answers
    assert client.available()  # after both commands ended
    assert (world / "state" / "daemon.log").stat().st_mode & 0o777 == 0o600
    up = sparkctl("up", "qwen36-dflash")
    out, err = up.communicate(timeout=180)
    assert up.returncode == 0 and "qwen36-dflash up: http://127.0.0.1:" in out and "started" not in err, err
    stop = subprocess.run([sys.executable, "-m", "sparkctl", "daemon", "--stop"], capture_output=True, text=True,
                          timeout=60)
    assert stop.returncode == 0 and f"stopped the daemon (pid {pid})" in stop.stdout, stop.stderr
    assert client.holder() is None and engine.client.containers.get(name("qwen36-dflash")).status == "running"
    again = sparkctl("status", "--json")
    out, err = again.communicate(timeout=120)
    [row] = json.loads(out)
    assert row["stack"] == "qwen36-dflash" and row["phase"] == "running" and client.holder() not in (None, pid)


def test_a_killed_engine_is_restarted_and_the_crash_recorded(start_daemon, cli, engine) -> None:
    daemon = start_daemon()
    assert cli("up", "qwen36-dflash")[0] == 0
    before = started_at(engine, name("qwen36-dflash"))
    engine.client.api.kill(name("qwen36-dflash"))
    wait_for(lambda: engine.inspect(name("qwen36-dflash")).status == "running"
             and started_at(engine, name("qwen36-dflash")) != before, what="restart")
    wait_for(lambda: {"died", "restarted"} <= {e["kind"] for e in daemon.client.get("/v1/history")["events"]},
             what="history")
    died = [e for e in daemon.client.get("/v1/history")["events"] if e["kind"] == "died"]
    assert died[0]["detail"] == "exit code 137"
    assert len(containers(engine)) == 1


def test_crash_loop_marks_failed_and_the_alias_falls_back_to_its_prefetched_standby(start_daemon, world, engine,
                                                                                     hub) -> None:
    """The fallback is not desired: the daemon prefetches it while the alias's stack runs, and the
    failover deploys it without fetching a file again."""
    (world / "stacks" / "crashy.yaml").write_text("name: crashy\nextends: qwen36-bf16-stock\ncontainer:\n  env:\n"
                                                  "    SPARKCTL_SIM_FAULTS: crash_after=0\n" + SMALL)
    (world / "stacks" / "steady.yaml").write_text("name: steady\nextends: qwen36-nvfp4-stock\n" + SMALL)
    (world / "state").mkdir(exist_ok=True)
    asked = len(hub.hub.requests)
    (world / "state" / "desired.yaml").write_text(
        "stacks: [crashy]\naliases: {primary: crashy}\nfallbacks: {primary: steady}\n")
    daemon = start_daemon()
    wait_for(lambda: any(r["failed"] for r in daemon.client.get("/v1/status")["stacks"]), timeout=90,
             what="crash loop")
    [crashy] = [r for r in daemon.client.get("/v1/status")["stacks"] if r["stack"] == "crashy"]
    assert crashy["failed"].startswith("crash loop: 5 failures")
    desired = daemon.client.get("/v1/desired")
    assert desired["aliases"] == {"primary": "steady"} and "steady" in desired["stacks"]
    def phases() -> list[str]:
        return sorted(d["phase"] for d in daemon.client.get("/v1/history?stack=steady")["deployments"])

    wait_for(lambda: "running" in phases(), timeout=90, what="the fallback deployed")
    attempts = daemon.client.get("/v1/history?stack=crashy")["deployments"]
    assert len(attempts) == 5 and all(d["phase"] == "failed" for d in attempts)
    assert phases() == ["fetched", "running"]  # the prefetch, then the failover
    assert [c["State"] for c in containers(engine, "steady")] == ["running"]
    got = [r.split()[1] for r in hub.hub.requests[asked:] if r.startswith("GET") and f"/{QWEN_NVFP4}/resolve/" in r]
    assert got and len(got) == len(set(got)), got  # each of its files once: the failover fetched none again


def test_adoption_after_kill9_keeps_engines_and_removes_strays(start_daemon, world, cli, engine) -> None:
    first = start_daemon()
    assert cli("up", "qwen36-dflash")[0] == 0
    before = started_at(engine, name("qwen36-dflash"))
    first.kill9()
    stray = engine.client.containers.create("sparkctl-sim:latest", ["--version"], name=f"sparkctl-{instance()}_stray",
                                            labels={"sparkctl.stack": "not-desired", "sparkctl.instance": instance()})
    start_daemon()
    wait_for(lambda: not containers(engine, "not-desired"), what="stray removal")
    assert started_at(engine, name("qwen36-dflash")) == before  # adopted, not restarted
    assert stray.id not in {c["Id"] for c in containers(engine)}


def converged(client: DaemonClient, engine) -> bool:
    """The machine matches desired.yaml: one running, settled container if the stack is desired
    (the kill may come before the daemon recorded the request), none if not."""
    wanted = "qwen36-dflash" in client.get("/v1/desired")["stacks"]
    states = [c["State"] for c in containers(engine, "qwen36-dflash")]
    if not wanted:
        return states == []
    rows = [r for r in client.get("/v1/status")["stacks"] if r["stack"] == "qwen36-dflash"]
    return states == ["running"] and bool(rows) and rows[0]["phase"] in ("running", "failed")


POINTS = 10  # kill points, alternately during a fresh `up` and during one that recreates the container


def test_kill9_at_random_points_of_up_converges(start_daemon, world, cli, engine, monkeypatch) -> None:
    rng = random.Random(20261129)
    daemon = start_daemon()
    for point in range(POINTS):
        worker = threading.Thread(target=asking, args=(daemon.client, "/v1/up", {"stack": "qwen36-dflash"}))
        if point % 2:  # also while a previous version is running: a changed engine env recreates it
            monkeypatch.setenv("SPARKCTL_ENGINE_ENV", f"SPARKCTL_SIM_TIME_SCALE=0.01,RUN={point}")
        worker.start()
        # the behaviour under test: a kill at a random moment of the `up`, stratified: each fifth of
        # its first 2 s gets one kill of each kind, so no stretch of it is missed by chance
        time.sleep((point // 2 + rng.random()) * 2.0 / (POINTS // 2))
        daemon.kill9()
        worker.join(60)
        assert not worker.is_alive(), f"`up` did not return after its daemon was killed (point {point})"
        daemon = start_daemon()
        wait_for(partial(converged, daemon.client, engine), timeout=60, what=f"convergence after kill point {point}",
                 logs=daemon.logs)
    store = Store(world / "state" / "sparkctl.db")
    assert store.integrity_ok()
    assert all(d.phase.is_terminal() for d in store.deployments.history("qwen36-dflash"))
    assert len(containers(engine)) <= 1


def asking(client, path: str, body: dict) -> None:  # noqa: ANN001 - a DaemonClient
    """An action asked of `client` (not through the CLI, which would start a daemon if it found
    none), followed to its end or to its daemon's death."""
    try:
        for _ in client.stream(path, body):
            pass
    except (OSError, SparkctlError):
        pass


def test_concurrent_ups_make_one_container_and_up_down_race_ends_in_the_later(start_daemon, cli, engine) -> None:
    daemon = start_daemon()
    results: list = []
    ups = [threading.Thread(target=lambda: results.append(list(daemon.client.stream("/v1/up", {
        "stack": "qwen36-dflash"}))[-1])) for _ in range(2)]
    for t in ups:
        t.start()
    for t in ups:
        t.join(120)
    assert [r["ok"] for r in results] == [True, True]
    assert len(containers(engine, "qwen36-dflash")) == 1
    streamed: list[dict] = []

    def racing_up() -> None:
        for event in daemon.client.stream("/v1/up", {"stack": "qwen36-dflash"}):
            streamed.append(event)

    up = threading.Thread(target=racing_up)
    up.start()
    wait_for(lambda: streamed, timeout=30, what="the racing `up` under way")  # it took its turn: the down is later
    outcome = list(daemon.client.stream("/v1/down", {"stack": "qwen36-dflash"}))[-1]
    up.join(120)
    assert not up.is_alive(), "the racing `up` did not return"
    assert outcome["ok"], outcome.get("error")
    wait_for(lambda: not containers(engine, "qwen36-dflash"), timeout=30, what="the stack's container removed")
    assert daemon.client.get("/v1/desired")["stacks"] == []


def raw_request(path: Path, request: bytes) -> tuple[int, bytes]:
    with socket.socket(socket.AF_UNIX) as s:
        s.connect(str(path))
        s.sendall(request)
        data = b""
        while chunk := s.recv(65536):
            data += chunk
    head, _, body = data.partition(b"\r\n\r\n")
    return int(head.split()[1]), body


@pytest.mark.parametrize(("body", "status", "words"), [
    (b"{not json", 400, b"not valid JSON"),
    (b'{"stack": 3}', 400, b"string fields: stack"),
    (b'{"stack": "no-such-stack"}', 404, b"no such stack"),
    (b'{"stack": "' + b"x" * 70000 + b'"}', 413, b"over 65536 bytes"),
])
def test_bad_api_input_gets_a_clear_error_and_the_daemon_keeps_serving(start_daemon, world, body, status,
                                                                       words) -> None:
    daemon = start_daemon()
    request = (b"POST /v1/up HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nConnection: close\r\n"
               b"Content-Length: " + str(len(body)).encode() + b"\r\n\r\n" + body)
    got_status, got_body = raw_request(world / "state" / "sparkctl.sock", request)
    assert got_status == status and words in got_body, got_body[:300]
    assert daemon.client.get("/v1/status")["stacks"] == []


class OwnDockerd:
    """A dockerd of the test's own beside the machine's, in the root namespace (the sim's engines
    use the host network): its data, exec root and socket in a short temporary directory (a unix
    socket path has 108 bytes), its containerd managed by itself. Restarting it disturbs no other
    test running on the machine's engine, and no owner's stacks."""

    def __init__(self) -> None:
        self.root = Path(tempfile.mkdtemp(prefix="spkd-"))
        self.url = f"unix://{self.root}/docker.sock"
        self.proc: subprocess.Popen | None = None

    def start(self) -> None:
        (self.root / "docker.sock").unlink(missing_ok=True)
        with open(self.root / "dockerd.log", "ab") as log:
            self.proc = subprocess.Popen(
                ["dockerd", "-H", self.url, "--data-root", str(self.root / "data"), "--exec-root",
                 str(self.root / "exec"), "--pidfile", str(self.root / "docker.pid"), "--bridge=none",
                 "--iptables=false", "--ip6tables=false"], stdout=log, stderr=subprocess.STDOUT)
        wait_for(self.answers, timeout=60, what="our dockerd to answer",
                 logs=lambda: (self.root / "dockerd.log").read_text())

    def answers(self) -> bool:
        try:
            return docker.DockerClient(base_url=self.url, timeout=5).ping()
        except docker.errors.DockerException:
            return False

    def stop(self) -> None:
        """SIGTERM: dockerd stops its containers and its containerd, and unmounts their layers."""
        if self.proc is not None:
            teardown.stop(self.proc, 30)

    def remove(self) -> None:
        self.stop()
        mounts = [line.split()[1] for line in Path("/proc/mounts").read_text().splitlines()
                  if line.split()[1].startswith(str(self.root))]
        for mount in sorted(mounts, reverse=True):  # left by a dockerd that had to be killed
            subprocess.run(["umount", "-l", mount], check=False)
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture
def own_dockerd(engine, monkeypatch) -> Iterator[OwnDockerd]:
    """A dockerd of the test's own, and the daemons it starts pointed at it."""
    if os.geteuid() != 0 or shutil.which("dockerd") is None:
        pytest.skip("starting a dockerd of the test's own needs root and dockerd")
    dockerd = OwnDockerd()
    try:
        dockerd.start()
        monkeypatch.setenv("SPARKCTL_DOCKER_HOST", dockerd.url)
        yield dockerd
    finally:
        dockerd.remove()


def test_dockerd_restart_is_survived_and_stacks_come_back(own_dockerd, start_daemon, cli) -> None:
    """The only way to show the event watcher reconnecting: the engine goes away under a running
    stack and comes back. On a dockerd of the test's own, so that it runs beside anything."""
    ours = DockerEngine(own_dockerd.url)
    daemon = start_daemon()
    assert cli("up", "qwen36-dflash")[0] == 0
    own_dockerd.stop()
    own_dockerd.start()
    wait_for(lambda: ours.inspect(name("qwen36-dflash")).status == "running", timeout=60, what="restart",
             logs=daemon.logs)
    wait_for(lambda: daemon.client.get("/v1/status")["stacks"][0]["phase"] == "running", what="healthy",
             logs=daemon.logs)
    wait_for(lambda: daemon.logs().count("docker_events_connected") >= 2, what="events reconnected",
             logs=daemon.logs)
    assert "docker_events_lost" in daemon.logs()
    assert len(containers(ours)) == 1


def test_metrics_and_the_optional_tcp_listener_need_the_token(start_daemon, monkeypatch, cli) -> None:
    from tests.conftest import free_port

    port = free_port()
    monkeypatch.setenv("SPARKCTL_API_TCP", f"127.0.0.1:{port}")
    monkeypatch.setenv("SPARKCTL_API_TOKEN", "tok-0123456789abcdef")
    daemon = start_daemon()
    assert cli("up", "qwen36-dflash")[0] == 0
    url = f"http://127.0.0.1:{port}"
    with pytest.raises(urllib.error.HTTPError) as denied:
        urllib.request.urlopen(url + "/v1/status", timeout=5)
    assert denied.value.code == 401
    request = urllib.request.Request(url + "/metrics", headers={"Authorization": "Bearer tok-0123456789abcdef"})
    text = urllib.request.urlopen(request, timeout=5).read().decode()
    for metric in ("sparkctl_reconcile_passes_total", "sparkctl_restarts_total", "sparkctl_phase_seconds_count",
                   'sparkctl_deploys_total{stack="qwen36-dflash",outcome="ok"} 1',
                   'sparkctl_stack_state{stack="qwen36-dflash",state="running"} 1'):
        assert metric in text
    assert "tok-0123456789abcdef" not in daemon.logs()


def test_the_gateway_routes_an_alias_to_the_daemons_stack(start_daemon, world) -> None:
    import openai

    (world / "state").mkdir(exist_ok=True)
    (world / "state" / "desired.yaml").write_text("stacks: [qwen36-dflash]\naliases: {primary: qwen36-dflash}\n")
    with (world / "stacks" / "qwen36-dflash.yaml").open("a") as f:
        f.write("request_defaults: {chat_template_kwargs: {enable_thinking: true}}\n")
    start_daemon()
    agent = openai.OpenAI(base_url=f"http://127.0.0.1:{os.environ['SPARKCTL_GATEWAY_PORT']}/v1", api_key="x",
                          max_retries=0)
    wait_for(lambda: "primary" in [m.id for m in agent.models.list().data], timeout=60, what="the alias")
    raw = agent.chat.completions.with_raw_response.create(model="primary", messages=[{"role": "user", "content": "hi"}],
                                                          max_tokens=8)
    reply = raw.parse()
    assert reply.model == "qwen36-dflash" and reply.choices[0].message.content
    # the stack's request defaults reached the engine (the sim echoes the kwargs it received)
    assert raw.headers["x-sim-chat-template-kwargs"] == '{"enable_thinking":true}'
    with pytest.raises(openai.NotFoundError) as e:
        agent.chat.completions.create(model="nope", messages=[{"role": "user", "content": "hi"}], max_tokens=1)
    assert e.value.body["source"] == "sparkctl"


def test_bad_api_input_is_a_4xx_never_a_500(start_daemon, monkeypatch) -> None:
    from tests.conftest import free_port

    port = free_port()
    monkeypatch.setenv("SPARKCTL_API_TCP", f"127.0.0.1:{port}")
    monkeypatch.setenv("SPARKCTL_API_TOKEN", "tok-0123456789abcdef")
    start_daemon()
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
    conn.putrequest("GET", "/v1/status")
    conn.putheader("Authorization", "Bearer t\xe9st".encode("latin-1"))
    conn.endheaders()
    assert conn.getresponse().status == 401
    request = urllib.request.Request(f"http://127.0.0.1:{port}/v1/events?since=abc",
                                     headers={"Authorization": "Bearer tok-0123456789abcdef"})
    with pytest.raises(urllib.error.HTTPError) as bad:
        urllib.request.urlopen(request, timeout=5)
    assert bad.value.code == 400 and "`since`" in bad.value.read().decode()


def test_one_daemon_per_state_dir_and_a_broken_desired_file_does_not_hide_it(start_daemon, world, cli) -> None:
    """The audit's case: a corrupt desired.yaml made the CLI think no daemon ran, and a second
    daemon deleted the live one's socket. The second now stops at the CLI's check, or at the
    state dir's lock if it gets past it, and the socket stays."""
    first = start_daemon()
    assert first.client.get("/v1/status")["pid"] == first.proc.pid
    (world / "state" / "desired.yaml").write_text("stacks: [unclosed\n")
    second = subprocess.run([sys.executable, "-m", "sparkctl", "daemon"], capture_output=True, text=True, timeout=60)
    assert second.returncode == 1 and f"a sparkctl daemon (pid {first.proc.pid}) already runs on" in second.stderr
    from sparkctl.daemon.process import exclusive

    with pytest.raises(SparkctlError, match=f"a sparkctl daemon \\(pid {first.proc.pid}\\) already runs on"):
        exclusive(world / "state" / "daemon.lock")
    assert first.client.available() and (world / "state" / "sparkctl.sock").exists()  # the socket is kept
    code, out, err = cli("up", "qwen36-dflash")
    assert code == 1 and "desired.yaml: line 2: invalid YAML" in err  # from the daemon, not a second deploy


def test_a_daemon_whose_state_dir_is_removed_stops_and_frees_its_port(workspace, engine) -> None:
    """A removed state dir (a test's temporary dir, a reset) ends its daemon within seconds: its
    gateway port is free again and its log says why."""
    daemon = DaemonProcess(workspace / "state")
    port = int(os.environ["SPARKCTL_GATEWAY_PORT"])
    shutil.rmtree(workspace / "state")
    try:
        assert daemon.proc.wait(timeout=15) == 0, daemon.logs()[-3000:]
    finally:
        daemon.stop()
    assert "state_dir_gone" in daemon.logs() and "daemon_stopped" in daemon.logs()
    with socket.socket() as free:
        free.bind(("127.0.0.1", port))
