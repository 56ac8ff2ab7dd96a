"""The fleet watch's probes of the engines placed on the fleet (`FleetWatch`'s base): `probe_pass`
runs every `PROBE_EVERY` on the fleet's head. The replicas whose `/health` fails on hosts not held
out are observed once per pass (their hosts' agents list their containers; Ray's node table is
read before and after) and `fleet.triage` decides: a replica is started again on its host only
when the host's agent answered and reported its container gone or exited (nothing else restarts
the fleet's containers), under the crash-loop rule; an agent that did not answer gets nothing
sent at all, since its host may be dying and a restart there could run once it is back, beside
the node watch's re-placement (issue 31): Ray's verdict decides. A multi-node group's `/health`
lies (a dead worker, a dead rank 0's orphaned worker, a downed link: issue 18), so its rank 0 gets
a 1-token completion with a `PROBE_TIMEOUT` instead; a failed one has the watch recreate the group
whole, where Ray has its bundles.
"""

from __future__ import annotations

import re
import time

import structlog

from sparkctl.adapters import engine
from sparkctl.daemon.planner import backoff
from sparkctl.errors import SparkctlError
from sparkctl.fleet import membership, placement, triage
from sparkctl.messages import Note
from sparkctl.node import AgentAnswer, Node

log = structlog.get_logger()
PROBE_EVERY = 1.0  # s between two probes of a multi-node group
PROBE_TIMEOUT = 3.0  # s a 1-token completion may take before the group counts as hung
AGENT_WAIT = 5.0  # s a failing replica's host agent has to list its containers; silent: nothing is sent there
SERVING, ASLEEP, DOWN = "serving", "asleep", "down"  # a placed replica, as its probe finds it
AWAKE = re.compile(r'^vllm:engine_sleep_state\{[^}]*sleep_state="awake"[^}]*\}\s+([0-9.eE+-]+)', re.MULTILINE)


class FleetProbe:
    """`FleetWatch`'s probes, on the state and the stop event its `__init__` sets: a group is
    re-placed through its `_recover_later`, and a stack whose recovery runs (`_recovering_now`) is
    left alone."""

    def auth(self) -> str:
        """The credential placed engines' relays ask for (read from the fleet's token each time:
        `fleet init` may write it after the daemon started)."""
        return membership.relay_auth(self.fleetwide.settings)

    def _probe_groups(self) -> None:
        while not self._stopping.wait(PROBE_EVERY):
            try:
                self.probe_pass()
            except Exception:  # noqa: BLE001 - the probes must outlive any one bad step
                log.exception("fleet_group_probe_failed")

    def probe_pass(self) -> None:
        """Every served stack probed once: each group's rank 0, then the single-host replicas."""
        book = placement.serving(placement.read_book(self.fleetwide.settings.fleet_dir))
        for placed in book.values():
            if placed.ranks and placed.replicas and not self._recovering_now(placed.stack):
                self._probe(placed)
        self.check_replicas([placed for placed in book.values() if not placed.ranks])

    def check_replicas(self, stacks: list[placement.Placed]) -> None:
        """The replicas of `stacks` that fail `/health` on hosts not held out: observed once,
        decided on by `triage.decide`, acted on (a dead host is the node watch's)."""
        failing, auth = [], self.auth() if stacks else ""
        for placed in (p for p in stacks if not self._recovering_now(p.stack)):
            for replica in placed.replicas:
                state = None if replica.host in self.down else engine_state(replica.url, auth)
                self._route_awake(placed.stack, replica.url, asleep=state == ASLEEP)
                if state in (None, SERVING, ASLEEP):
                    self.given_up.discard(f"{placed.stack}@{replica.host}")
                else:
                    failing.append((placed, replica))
        if not failing:
            return
        seen, nodes = self._observe(failing)
        for (placed, _), one in zip(failing, seen, strict=True):
            self._act(placed, triage.decide(one, failures=self.failures.get(one.key, ()),
                                            given_up=one.key in self.given_up, now=self.clock(),
                                            crash_loop=self.policy.crash_loop, window=self.policy.window), nodes)

    def _observe(self, failing: list[tuple[placement.Placed, placement.Replica]]
                 ) -> tuple[list[triage.Seen], list[Node] | None]:
        """One observation of the failing replicas: Ray's table before, their live hosts' agents'
        container lists, Ray's table and the book after; and that last table."""
        before = self.nodes
        hosts = sorted({r.host for _, r in failing if triage.live_node(before, r.host)})
        answers = self._containers(hosts, before or []) if hosts else {}
        after = self.nodes
        book = placement.read_book(self.fleetwide.settings.fleet_dir)
        return [triage.Seen(placed.stack, r.host, r.url, placed=book.get(placed.stack) == placed,
                            down=r.host in self.down, node_before=triage.live_node(before, r.host),
                            node_after=triage.live_node(after, r.host), answer=answers.get(r.host))
                for placed, r in failing], after

    def _containers(self, hosts: list[str], nodes: list[Node]) -> dict[str, AgentAnswer]:
        try:
            answers = self.fleetwide.containers(hosts, wait=AGENT_WAIT, nodes=nodes)
        except SparkctlError as e:  # Ray's head did not carry the call: no agent was heard
            answers = [AgentAnswer(host=h, error=str(e)) for h in hosts]
        return {a.host: a for a in answers}

    def _act(self, placed: placement.Placed, decision: triage.Decision, nodes: list[Node] | None) -> None:
        seen = decision.seen
        if isinstance(decision, triage.Leave):
            self._await_ray(decision)
            return
        self.awaiting.discard(seen.key)
        self.failures[seen.key] = decision.failures
        if isinstance(decision, triage.GiveUp):
            self._give_up(seen.key, decision.failures)
            return
        log.warning("fleet_replica_down", stack=seen.stack, host=seen.host, url=seen.url, container=decision.state)
        try:
            self.fleetwide.restart(placed, seen.host, wait=self.wait, nodes=nodes or [])
        except SparkctlError as e:
            log.error("fleet_replica_restart_failed", stack=seen.stack, host=seen.host, error=str(e))
            return
        log.info("fleet_replica_restarted", stack=seen.stack, host=seen.host)
        self.control.restore_engine(seen.url)  # back in routing now, not after the gateway's own ejection

    def _await_ray(self, decision: triage.Leave) -> None:
        """Say once per episode that a failing replica's host goes unjudged until Ray's verdict."""
        seen = decision.seen
        if not decision.why.awaits_ray():
            self.awaiting.discard(seen.key)
            return
        if seen.key not in self.awaiting:
            self.awaiting.add(seen.key)
            log.warning("fleet_replica_awaits_ray", stack=seen.stack, host=seen.host, url=seen.url,
                        why=str(decision.why), error=seen.answer.error if seen.answer else None,
                        note="nothing is sent to that host until Ray declares it dead (the stack is "
                             "re-placed) or its agent answers again")

    def _probe(self, placed: placement.Placed) -> None:
        url = placed.replicas[0].url
        failed_at = time.time()
        why = probe(url, self.served_name(placed.stack), self.auth())
        if why is None:
            if self._recovering_now(placed.stack):  # a recreation runs: it puts the group back when done
                return
            if url in self.held_out:  # it answers again (or was brought up again)
                self.held_out.discard(url)
                self.control.restore_engine(url)
            self.given_up.discard(placed.stack)
            return
        if placed.stack in self.given_up:  # a crash loop: left out until it answers again
            return
        self._hold_out(url)
        log.warning("fleet_group_ejected", stack=placed.stack, url=url, why=why, failed_at=failed_at,
                    ejected_at=time.time())
        self.bus.publish(Note(placed.stack, f"{placed.stack}'s group failed its probe ({why}): recreating it"))
        if self._crash_loop(placed.stack):
            return
        self._stopping.wait(backoff(len(self.failures[placed.stack]), self.policy))
        current = placement.read_book(self.fleetwide.settings.fleet_dir).get(placed.stack)
        if current != placed:  # recovered meanwhile (its host died, say), or taken down: nothing to redo
            return
        if probe(url, self.served_name(placed.stack), self.auth()) is None:  # it came back by itself
            self._probe(placed)
            return
        self._recover_later(placed)

    def _crash_loop(self, key: str) -> bool:
        """Count one more failure of group `key`; True, and left alone from now on until it
        answers again, once the crash-loop rule says so."""
        recent, looping = triage.count_failure(self.failures.get(key, ()), now=self.clock(),
                                               crash_loop=self.policy.crash_loop, window=self.policy.window)
        self.failures[key] = recent
        if looping:
            self._give_up(key, recent)
        return looping

    def _give_up(self, key: str, failures: tuple[float, ...]) -> None:
        self.given_up.add(key)
        log.error("fleet_crash_loop", key=key, failures=len(failures),
                  note="left out of routing until it answers: `sparkctl fleet up` it again once fixed")

    def _hold_out(self, url: str) -> None:
        if url not in self.held_out:
            self.control.eject_engine(url)
            self.held_out.add(url)

    def _route_awake(self, stack: str, url: str, *, asleep: bool) -> None:
        """A placed engine asleep without the daemon's word (it parks placed stacks by removing
        them) is out of routing until it wakes: vLLM queues a sleeping engine's requests without an
        answer. It needs no restart: it is alive."""
        if asleep == (url in self.asleep):
            return
        if asleep:
            self.asleep.add(url)
            self.control.eject_engine(url)
            log.warning("fleet_replica_asleep", stack=stack, url=url, note="out of routing until it wakes")
        else:
            self.asleep.discard(url)
            self.control.restore_engine(url)
            log.info("fleet_replica_awake", stack=stack, url=url)


def probe(url: str, model: str, auth: str) -> str | None:
    """A 1-token completion at `url` within PROBE_TIMEOUT: None when it answered 200, else why not.
    `auth`: the fleet's relay credential (`membership.relay_auth`)."""
    body = {"model": model, "max_tokens": 1, "messages": [{"role": "user", "content": "ping"}]}
    try:
        status, _ = engine.call(url, "/v1/chat/completions", body=body, headers={"Authorization": auth},
                                timeout=PROBE_TIMEOUT)
        return None if status == 200 else f"status {status}"
    except OSError as e:
        return f"no answer within {PROBE_TIMEOUT:g} s" if isinstance(e, TimeoutError) else f"unreachable ({e})"


def engine_state(url: str, auth: str) -> str:
    """The engine at `url`: DOWN (no 200 from `/health` within PROBE_TIMEOUT), ASLEEP (its
    `/metrics` say `vllm:engine_sleep_state{sleep_state="awake"} 0`), else SERVING."""
    if engine.status(url, "/health", headers={"Authorization": auth}, timeout=PROBE_TIMEOUT) != 200:
        return DOWN
    try:
        awake = AWAKE.search(engine.text(url, "/metrics", headers={"Authorization": auth}, timeout=PROBE_TIMEOUT))
    except OSError:  # refused, reset, timed out, or an HTTP error status
        return DOWN
    return ASLEEP if awake is not None and float(awake[1]) == 0 else SERVING
