"""The `sparkctl` console script. With a daemon running, the calls people repeat most (`status`,
`stacks list`, `up STACK`) are answered from here, with the standard library and rich at most:
neither typer nor the command modules load, and the call costs Python's start plus one request
(docs/perf.md); without one, so is an `up` its last in-process deploy's record confirms.
Everything else goes to the typer app (`cli/app.py`), whose error boundary this one matches: one
red line, exit code 1."""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable, Sequence
from functools import partial
from typing import TYPE_CHECKING, NoReturn

from sparkctl.cli import views
from sparkctl.cli.console import fail
from sparkctl.errors import SparkctlError

if TYPE_CHECKING:
    from sparkctl.cli.client import DaemonClient


def main(argv: Sequence[str] | None = None) -> int:
    """Run the CLI; every error ends as one line and exit code 1."""
    args = list(sys.argv[1:] if argv is None else argv)
    answer = _fast(args)
    try:
        if answer is not None and answer():
            return 0
    except (KeyboardInterrupt, Exception) as e:  # noqa: BLE001 - the boundary: a bug must still end in one line
        return failed(e, fail)
    from sparkctl.cli import app

    return app.main(args)


def command() -> NoReturn:
    """The console script: `main`, then an exit whose teardown does not walk every object the
    imports made (`gc.freeze`: about 60 ms less per call, docs/perf.md)."""
    code = main()
    gc.freeze()
    sys.exit(code)


def failed(e: BaseException, say_error: Callable[[str], None]) -> int:
    """The boundary's answer to `e`: one line through `say_error`, and the exit code."""
    if isinstance(e, KeyboardInterrupt):
        fail("aborted")
        return 130
    if isinstance(e, SparkctlError):
        say_error(f"error: {e}")
    else:
        say_error(f"internal error: {type(e).__name__}: {e} (rerun with --debug for the traceback)")
    return 1


def _fast(args: list[str]) -> Callable[[], bool] | None:
    """How to answer `args` without typer, if it is a call the fast path takes; the answer returns
    False when it cannot (no daemon; for `up`, no unchanged record either) and typer takes over."""
    match args:
        case ["status"] | ["status", "--json"]:
            return partial(_status, as_json=args[-1] == "--json")
        case ["stacks", "list"]:
            return _stacks
        case ["up", stack, *flags] if not stack.startswith("-") and set(flags) <= {"--refresh", "--replace"}:
            return partial(_up, stack, refresh="--refresh" in flags, replace="--replace" in flags)
    return None


def _status(*, as_json: bool) -> bool:
    from sparkctl.locate import located

    if not (daemon := _daemon()).available():
        return False
    from sparkctl import answers

    views.status(answers.Status.from_json(daemon.get("/v1/status")), as_json=as_json, instance=located()[0])
    return True


def _stacks() -> bool:
    if not (daemon := _daemon()).available():
        return False
    from sparkctl import answers

    views.stacks(tuple(answers.StackRow(**row) for row in daemon.get("/v1/stacks")["stacks"]))
    return True


def _up(stack: str, *, refresh: bool, replace: bool) -> bool:
    if (daemon := _daemon()).available():
        views.up(daemon, stack, refresh=refresh, replace=replace)
        return True
    return not (refresh or replace) and views.up_unchanged(stack)


def _daemon() -> DaemonClient:
    from sparkctl.cli.client import DaemonClient
    from sparkctl.locate import socket_path

    return DaemonClient(socket_path())
