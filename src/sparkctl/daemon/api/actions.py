"""The API's actions: each request checked, a ticket for its stack's (or alias's) turn taken as it
arrives, then the action run on a worker thread while its events stream back as NDJSON, ending
with its outcome."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import time
from collections.abc import AsyncIterator, Callable
from typing import Any

from aiohttp import web

from sparkctl import results, wire
from sparkctl.daemon.api import http
from sparkctl.daemon.api.service import COMMANDS, QUERIES, Commands
from sparkctl.errors import SparkctlError
from sparkctl.log import redact
from sparkctl.policy.parking import Park

_actions = itertools.count(1)  # numbers the streamed actions, so each finds its own end


async def up(request: web.Request) -> web.StreamResponse:
    return await _on_stack(request, wire.UpRequest, lambda actions, ask, stack, ticket: actions.deploys.up(
        stack, refresh=ask.refresh, replace=ask.replace, ticket=ticket))


async def pull(request: web.Request) -> web.StreamResponse:
    return await _on_stack(request, wire.PullRequest, lambda actions, ask, stack, ticket: actions.deploys.pull(
        stack, refresh=ask.refresh, ticket=ticket))


async def cancel(request: web.Request) -> web.Response:
    """Stop the fetch streams of the stack's deploy or pull under way (the CLI's Ctrl-C); not in
    the stack's turn, which that deploy holds."""
    ask = await http.parse_body(request, wire.CancelRequest)
    stopped = await asyncio.to_thread(request.app[COMMANDS].deploys.cancel, ask.stack)
    return web.json_response({"stack": ask.stack, "stopped": stopped})


async def down(request: web.Request) -> web.StreamResponse:
    return await _on_stack(request, wire.DownRequest,
                           lambda actions, ask, stack, ticket: actions.deploys.down(stack, ticket=ticket))


async def switch(request: web.Request) -> web.StreamResponse:
    ask = await http.parse_body(request, wire.SwitchRequest)
    actions, reads = request.app[COMMANDS], request.app[QUERIES]
    async with _queued(actions, f"alias:{ask.alias}") as ticket:
        stack = await asyncio.to_thread(reads.check_stack, ask.stack)
        old = (await asyncio.to_thread(reads.desired)).aliases.get(ask.alias)
    return await _stream_action(request, (stack, ask.alias, *filter(None, [old])),
                                lambda: actions.aliases.switch(ask.alias, stack, ticket=ticket))


async def route(request: web.Request) -> web.StreamResponse:
    ask = await http.parse_body(request, wire.RouteRequest)
    actions = request.app[COMMANDS]
    async with _queued(actions, f"alias:{ask.alias}") as ticket:
        pass
    return await _stream_action(request, (ask.alias,),
                                lambda: actions.aliases.route(ask.alias, ask.rules, ticket=ticket))


async def park(request: web.Request) -> web.StreamResponse:
    return await _on_stack(request, wire.ParkRequest,
                           lambda actions, ask, stack, ticket: actions.parking.park(stack, how=Park(ask.how),
                                                                                   ticket=ticket),
                           check=lambda ask: ask.how in set(Park) or f"`how` must be one of {', '.join(Park)}")


async def wake(request: web.Request) -> web.StreamResponse:
    return await _on_stack(request, wire.WakeRequest,
                           lambda actions, ask, stack, ticket: actions.parking.wake(stack, ticket=ticket))


async def retest(request: web.Request) -> web.StreamResponse:
    """One retest at a time; its events are those of the trial of the stack it measures with."""
    ask = await http.parse_body(request, wire.RetestRequest)
    trials = request.app[COMMANDS].trials
    async with _queued(request.app[COMMANDS], "retest:") as ticket:
        trial, stack = await asyncio.to_thread(trials.retest_target, ask.ref, ask.stack)
    return await _stream_action(request, (trial, stack),
                                lambda: trials.retest(ask.ref, stack=stack, force=ask.force, ticket=ticket))


async def compare(request: web.Request) -> web.Response:
    """A comparison report of the runs in `{"runs": [id, ...], "label": "..."}`."""
    body = await http.json_body(request)
    try:
        chosen, label = [int(r) for r in body["runs"]], str(body.get("label", ""))
    except (KeyError, TypeError, ValueError, AttributeError):
        raise http.bad(400, 'request body must be {"runs": [run id, ...], "label": "..."}') from None
    written = await asyncio.to_thread(request.app[COMMANDS].trials.compare, chosen, label)
    return web.json_response(results.encode_done(written))


async def _on_stack(request: web.Request, kind: type[wire.Request], act: Callable[[Commands, Any, str, int], Any],
                    check: Callable[[Any], bool | str] = lambda ask: True) -> web.StreamResponse:
    """An action on one stack: the request checked, a ticket for the stack's turn taken as it
    arrives, the stack name checked, then the action streamed."""
    ask = await http.parse_body(request, kind)
    if (problem := check(ask)) is not True:
        raise http.bad(400, str(problem))
    actions = request.app[COMMANDS]
    async with _queued(actions, ask.stack) as ticket:
        stack = await asyncio.to_thread(request.app[QUERIES].check_stack, ask.stack)
    return await _stream_action(request, (stack,), lambda: act(actions, ask, stack, ticket))


@contextlib.asynccontextmanager
async def _queued(actions: Commands, key: str) -> AsyncIterator[int]:
    """A ticket for `key`'s next turn, taken as the request arrives (so actions on a stack take
    effect in arrival order). If the request is refused before its action runs, the turn is
    passed on in the background, so the requests behind it are not stuck."""
    ticket = actions.turns.ticket(key)
    try:
        yield ticket
    except BaseException:
        asyncio.get_running_loop().run_in_executor(None, actions.turns.skip, key, ticket)
        raise


async def _stream_action(request: web.Request, names: tuple[str, ...],
                         work: Callable[[], results.Done]) -> web.StreamResponse:
    """Run `work` in a thread; stream the events of these stacks (or alias) meanwhile; end with
    the outcome. The work starts before the response does: it holds a ticket that must be used.
    Its last event is its own `Finished`, published after all of its others: the stream ends
    there, whenever the thread's result reaches the loop."""
    stack, action = names[0], next(_actions)
    bus = request.app[COMMANDS].bus
    since = bus.last

    def run() -> results.Done:
        try:
            return work()
        finally:
            bus.publish(wire.Finished(stack, action))

    task = asyncio.get_running_loop().run_in_executor(None, run)
    response = await http.ndjson(request)
    finished = False
    while not finished:
        events = await bus.wait_after(since, timeout=0 if task.done() else 15)
        finished = task.done() and not events  # its Finished fell out of the bus's memory
        for event in events:
            since = event["seq"]
            finished = finished or (event["kind"] == "finished" and event["action"] == action)
            if event.get("stack") in names and event["kind"] in wire.STREAMED:
                await response.write(json.dumps(event).encode() + b"\n")
    await asyncio.wait([task])
    error = task.exception()
    if error is None:
        outcome = wire.Outcome(stack, True, result=task.result())
    else:
        outcome = wire.Outcome(stack, False, error=redact(str(error) if isinstance(error, SparkctlError)
                                                          else f"internal error: {error!r}"))
    line = outcome.to_json() | {"time": time.time()}
    await response.write(json.dumps(line).encode() + b"\n")
    await response.write_eof()
    return response
