"""The `sparkctl` console script: the root command, its command groups, and the CLI's one error
boundary. `main()` runs the typer app and turns any failure into one red line and exit code 1
(the traceback only with `--debug`; 130 on Ctrl-C).
"""

from __future__ import annotations

import gc
import importlib
import sys
from collections.abc import Sequence
from typing import TYPE_CHECKING, NoReturn

import typer
from typer.core import TyperGroup

from sparkctl import __version__
from sparkctl.cli import deploy, doctor, service
from sparkctl.cli.console import fail
from sparkctl.cli.runtime import Runtime
from sparkctl.errors import SparkctlError

if TYPE_CHECKING:
    from typer._click import Command, Context

# Command groups by name -> the module whose `app` they are, imported only when the group is
# called or help lists it: `sparkctl status` does not pay for Ray's fleet or the benchmark tool.
GROUPS = {"stacks": "sparkctl.cli.stacks", "image": "sparkctl.cli.images", "config": "sparkctl.cli.config",
          "bench": "sparkctl.cli.bench", "fleet": "sparkctl.cli.fleet", "route": "sparkctl.cli.route",
          "sim": "sparkctl.cli.sim"}


class Root(TyperGroup):
    def list_commands(self, ctx: Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *GROUPS})

    def get_command(self, ctx: Context, name: str) -> Command | None:
        if name in GROUPS and name not in self.commands:
            group = typer.main.get_group(importlib.import_module(GROUPS[name]).app)
            group.name = name
            self.add_command(group)
        return super().get_command(ctx, name)


app = typer.Typer(
    name="sparkctl",
    cls=Root,
    help="Deploy, pin, patch, health-check, switch and benchmark LLM stacks on DGX Spark.",
    no_args_is_help=True,
    add_completion=True,
    pretty_exceptions_enable=False,
)
app.add_typer(deploy.patch_app, name="patch")
app.add_typer(service.app, name="service")
for command in (deploy.up, deploy.pull, deploy.down, deploy.switch, deploy.park, deploy.wake, deploy.status,
                deploy.logs, service.daemon, service.dashboard, doctor.doctor):
    app.command()(command)

_runtime = Runtime()


@app.callback()
def root(
    ctx: typer.Context,
    debug: bool = typer.Option(False, "--debug", help="Show tracebacks on errors."),
) -> None:
    _runtime.debug = debug
    ctx.obj = _runtime


@app.command()
def version() -> None:
    """Print sparkctl's version and the commit it was built from."""
    from sparkctl.origin import commit

    print(f"sparkctl {__version__} (commit {commit()})")


def command() -> NoReturn:
    """The console script: `main`, then an exit whose teardown does not walk every object the
    imports made (`gc.freeze`: about 60 ms less per call, docs/perf.md)."""
    code = main(sys.argv[1:])
    gc.freeze()
    sys.exit(code)


def main(argv: Sequence[str]) -> int:
    """Run the typer app; every error ends here as one line and exit code 1."""
    try:
        # Without standalone mode, click returns a command's `typer.Exit(code)` instead of raising it
        code = app(args=list(argv), prog_name="sparkctl", standalone_mode=False)
    except typer.Exit as e:
        return e.exit_code
    except typer.Abort:
        fail("aborted")
        return 130
    except typer.TyperException as e:  # usage errors: typer prints them with the usage line
        e.show()
        return getattr(e, "exit_code", 2)
    except Exception as e:  # noqa: BLE001 - the boundary: a bug must still end in one line
        return failed(e)
    return code if isinstance(code, int) else 0


def _fail(line: str) -> None:
    if _runtime.debug:
        import traceback  # only for --debug: ~10 ms of every call otherwise

        traceback.print_exc(file=sys.stderr)
    settings = _runtime.__dict__.get("settings")  # once loaded: its secrets never reach the screen
    if settings is not None:
        from sparkctl.log import Redactor

        line = Redactor(settings.secrets()).scrub(line)
    fail(line)


def failed(e: BaseException) -> int:
    """The boundary's answer to `e`: one line (`_fail`), and the exit code."""
    if isinstance(e, KeyboardInterrupt):
        fail("aborted")
        return 130
    if isinstance(e, SparkctlError):
        _fail(f"error: {e}")
    else:
        _fail(f"internal error: {type(e).__name__}: {e} (rerun with --debug for the traceback)")
    return 1
