"""The API's actions: each request checked and named (`Underway`), a ticket for its stack's (or
alias's) turn taken as it arrives, then the action run as a task on the loop while its events
stream back as NDJSON, ending with its outcome. A cancel names one action under way, never a stack."""

from __future__ import annotations

import asyncio
import contextlib
import json
import threading
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from aiohttp import web

from sparkctl import messages
from sparkctl.daemon.api import http
from sparkctl.daemon.api.service import COMMANDS, QUERIES, Commands
from sparkctl.daemon.seam import blocking
from sparkctl.errors import SparkctlError
from sparkctl.log import redact
from sparkctl.policy.parking import Park

if TYPE_CHECKING:
    from sparkctl.daemon.actions.machines import Fleet

UNDERWAY = web.AppKey("underway", dict)  # name -> the action `Underway`: what a cancel can name


@dataclass
class Underway:
    """An action the API accepted, from its arrival until its task ends: what a cancel that
    names it needs."""

    name: str  # the client's (`messages.Asked.action`), or the daemon's
    key: str  # the queue it takes its turn in: its stack, `alias:NAME` or `retest:`
    ticket: int
    stop: threading.Event | None  # a cancel sets it: its fetch streams end (None: nothing to stop)
    task: asyncio.Task | None = None  # its task, once started


async def up(request: web.Request) -> web.StreamResponse:
    return await _on_stack(request, messages.UpRequest, lambda actions, ask, stack, this: actions.deploys.up(
        stack, refresh=ask.refresh, replace=ask.replace, ticket=this.ticket, stop=this.stop), stoppable=True)


async def pull(request: web.Request) -> web.StreamResponse:
    return await _on_stack(request, messages.PullRequest, lambda actions, ask, stack, this: actions.deploys.pull(
        stack, refresh=ask.refresh, ticket=this.ticket, stop=this.stop), stoppable=True)


async def cancel(request: web.Request) -> web.Response:
    """Cancel the action the request names (a CLI's Ctrl-C), and say what came of it. Still
    waiting for its turn: it leaves the queue and never runs. Running: an `up` or `pull` still
    fetching has its own fetch streams stopped (no other action's), and the answer waits for its
    end, so that `cancelled` is the truth; past its fetch (the pipeline sets `stop` as its fetch
    ends), or any other action, it runs to its end."""
    ask = await http.parse_body(request, messages.CancelRequest)
    this = request.app[UNDERWAY].get(ask.action)
    if this is None:
        done = messages.CancelDone(ask.action, False, "no such action under way: it ended, or never reached the daemon")
    elif request.app[COMMANDS].turns.withdraw(this.key, this.ticket):
        done = messages.CancelDone(ask.action, True, "it left the queue before its turn: it did not run")
    elif this.stop is None or this.stop.is_set() or this.task is None:
        done = messages.CancelDone(ask.action, False, "it is under way past anything a cancel stops (its fetch): "
                                                     "it runs to its end")
    else:
        this.stop.set()
        await asyncio.wait([this.task])
        error = this.task.exception()
        done = messages.CancelDone(ask.action, error is not None, f"it stopped: {_failure(error)}" if error
                                  else "it had fetched all it needed and ran to its end")
    return web.json_response(messages.encode_done(done))


async def down(request: web.Request) -> web.StreamResponse:
    return await _on_stack(request, messages.DownRequest,
                           lambda actions, ask, stack, this: actions.deploys.down(stack, ticket=this.ticket))


async def switch(request: web.Request) -> web.StreamResponse:
    ask = await http.parse_body(request, messages.SwitchRequest)
    actions, reads = request.app[COMMANDS], request.app[QUERIES]
    async with _queued(request, ask, f"alias:{ask.alias}") as this:
        stack = await blocking(reads.check_stack, ask.stack)
        old = (await blocking(reads.desired)).aliases.get(ask.alias)
    return await _stream_action(request, this, (stack, ask.alias, *filter(None, [old])),
                                lambda: actions.aliases.switch(ask.alias, stack, ticket=this.ticket))


async def route(request: web.Request) -> web.StreamResponse:
    ask = await http.parse_body(request, messages.RouteRequest)
    actions = request.app[COMMANDS]
    async with _queued(request, ask, f"alias:{ask.alias}") as this:
        pass
    return await _stream_action(request, this, (ask.alias,),
                                lambda: actions.aliases.route(ask.alias, ask.rules, ticket=this.ticket))


async def park(request: web.Request) -> web.StreamResponse:
    return await _on_stack(request, messages.ParkRequest,
                           lambda actions, ask, stack, this: actions.parking.park(stack, how=Park(ask.how),
                                                                                 ticket=this.ticket),
                           check=lambda ask: ask.how in set(Park) or f"`how` must be one of {', '.join(Park)}")


async def wake(request: web.Request) -> web.StreamResponse:
    return await _on_stack(request, messages.WakeRequest,
                           lambda actions, ask, stack, this: actions.parking.wake(stack, ticket=this.ticket))


async def fleet_up(request: web.Request) -> web.StreamResponse:
    """`sparkctl fleet up`: placed and started across the fleet this daemon heads, in the stack's turn."""
    fleet = _fleet(request.app[COMMANDS])
    return await _on_stack(request, messages.FleetUpRequest, lambda actions, ask, stack, this: fleet.up(
        stack, wait=ask.wait, ticket=this.ticket, say=lambda text: actions.bus.publish(messages.Note(stack, text))))


async def fleet_down(request: web.Request) -> web.StreamResponse:
    """`sparkctl fleet down`: any stack's containers across the fleet, whether a stack file still names it."""
    fleet = _fleet(request.app[COMMANDS])
    ask = await http.parse_body(request, messages.FleetDownRequest)
    async with _queued(request, ask, ask.stack) as this:
        pass
    return await _stream_action(request, this, (ask.stack,),
                                lambda: fleet.down(ask.stack, wait=ask.wait, ticket=this.ticket))


async def fleet_ps(request: web.Request) -> web.Response:
    """`sparkctl fleet ps`: every host's containers, as its agent lists them, and the book."""
    fleet = _fleet(request.app[COMMANDS])
    ask = await http.parse_body(request, messages.FleetPsRequest)
    return web.json_response(asdict(await fleet.ps(wait=ask.wait, book_only=ask.book_only)))


def _fleet(actions: Commands) -> Fleet:
    """The fleet this daemon heads; refused before anything queues when it heads none."""
    if actions.fleet is None:
        raise SparkctlError("this daemon heads no fleet (it reads this Spark's node record at its start): run it "
                            "on the fleet's head, after `sparkctl fleet init` (`sparkctl daemon --stop`, then "
                            "run the command again, or `systemctl restart sparkctl`)")
    return actions.fleet


async def retest(request: web.Request) -> web.StreamResponse:
    """One retest at a time; its events are those of the trial of the stack it measures with."""
    ask = await http.parse_body(request, messages.RetestRequest)
    trials = request.app[COMMANDS].trials
    async with _queued(request, ask, "retest:") as this:
        trial, stack = await blocking(trials.retest_target, ask.ref, ask.stack)
    return await _stream_action(request, this, (trial, stack),
                                lambda: trials.retest(ask.ref, stack=stack, force=ask.force, ticket=this.ticket))


async def bench(request: web.Request) -> web.StreamResponse:
    return await _on_stack(request, messages.BenchRequest, lambda actions, ask, stack, this: actions.bench.run(
        stack, ask, ticket=this.ticket, stop=this.stop), stoppable=True)


async def patch_check(request: web.Request) -> web.StreamResponse:
    return await _on_stack(request, messages.PatchCheckRequest, lambda actions, ask, stack, this: actions.patches.check(
        stack, ticket=this.ticket, stop=this.stop), stoppable=True)


async def image(request: web.Request) -> web.Response:
    """An edit of the image policy (`images.yaml`): short, so answered whole, not streamed."""
    ask = await http.parse_body(request, messages.ImageEdit)
    return web.json_response(messages.encode_done(await blocking(request.app[COMMANDS].images.edit, ask)))


async def compare(request: web.Request) -> web.Response:
    """A comparison report of the runs in `{"runs": [id, ...], "label": "..."}`."""
    body = await http.json_body(request)
    try:
        chosen, label = [int(r) for r in body["runs"]], str(body.get("label", ""))
    except (KeyError, TypeError, ValueError, AttributeError):
        raise http.bad(400, 'request body must be {"runs": [run id, ...], "label": "..."}') from None
    written = await blocking(request.app[COMMANDS].trials.compare, chosen, label)
    return web.json_response(messages.encode_done(written))


async def _on_stack(request: web.Request, kind: type[messages.Request],
                    act: Callable[[Commands, Any, str, Underway], Awaitable[messages.Done]],
                    check: Callable[[Any], bool | str] = lambda ask: True, stoppable: bool = False
                    ) -> web.StreamResponse:
    """An action on one stack: the request checked, a ticket for the stack's turn taken as it
    arrives, the stack name checked, then the action streamed."""
    ask = await http.parse_body(request, kind)
    if (problem := check(ask)) is not True:
        raise http.bad(400, str(problem))
    actions = request.app[COMMANDS]
    async with _queued(request, ask, ask.stack, stoppable=stoppable) as this:
        stack = await blocking(request.app[QUERIES].check_stack, ask.stack)
    return await _stream_action(request, this, (stack,), lambda: act(actions, ask, stack, this))


@contextlib.asynccontextmanager
async def _queued(request: web.Request, ask: messages.Asked, key: str, *, stoppable: bool = False
                  ) -> AsyncIterator[Underway]:
    """The action under way, named, with a ticket for `key`'s next turn taken as the request
    arrives (so actions on a stack take effect in arrival order). If the request is refused
    before its action runs, its ticket leaves the queue, so the requests behind it are not stuck."""
    underway, turns = request.app[UNDERWAY], request.app[COMMANDS].turns
    name = ask.action or uuid.uuid4().hex
    if name in underway:
        raise http.bad(400, f"an action named {name!r} is under way already: name each action anew")
    this = underway[name] = Underway(name, key, turns.ticket(key), threading.Event() if stoppable else None)
    try:
        yield this
    except BaseException:
        turns.withdraw(key, this.ticket)
        del underway[name]
        raise


async def _stream_action(request: web.Request, this: Underway, names: tuple[str, ...],
                         work: Callable[[], Awaitable[messages.Done]]) -> web.StreamResponse:
    """Run `work` as a task; stream the events of these stacks (or alias) meanwhile; end with
    the outcome. The work starts before the response does: it holds a ticket that must be used.
    Its last event is its own `Finished`, published after all of its others (its workers'
    included: they cross to the loop in order): the stream ends there. The action stays under
    way (a cancel finds it) until its task ends, whether or not its client still reads."""
    stack, bus = names[0], request.app[COMMANDS].bus
    since = bus.last

    async def run() -> messages.Done:
        try:
            return await work()
        finally:
            bus.publish(messages.Finished(stack, this.name))

    task = this.task = asyncio.create_task(run())
    task.add_done_callback(lambda _: request.app[UNDERWAY].pop(this.name, None))
    response = await http.ndjson(request)
    if request.app[COMMANDS].turns.waiting(this.key, this.ticket):  # its client hears why nothing happens yet
        waiting = messages.Note(stack, f"waiting for its turn: an earlier action on {this.key} is under way")
        await response.write(json.dumps({"kind": waiting.kind, **asdict(waiting), "time": time.time()}).encode()
                             + b"\n")
    finished = False
    while not finished:
        events = await bus.wait_after(since, timeout=0 if task.done() else 15)
        finished = task.done() and not events  # its Finished fell out of the bus's memory
        for event in events:
            since = event["seq"]
            finished = finished or (event["kind"] == "finished" and event["action"] == this.name)
            if event.get("stack") in names and event["kind"] in messages.STREAMED:
                await response.write(json.dumps(event).encode() + b"\n")
    await asyncio.wait([task])
    error = task.exception()
    if error is None:
        outcome = messages.Outcome(stack, True, result=task.result())
    else:
        outcome = messages.Outcome(stack, False, error=_failure(error))
    line = outcome.to_json() | {"time": time.time()}
    await response.write(json.dumps(line).encode() + b"\n")
    await response.write_eof()
    return response


def _failure(error: BaseException) -> str:
    """What an action's failure says to its client."""
    return redact(str(error) if isinstance(error, SparkctlError) else f"internal error: {error!r}")
