"""What a command needs, built when first asked for: the daemon's client (starting a daemon when
none runs), and for the commands that read files themselves the settings, catalog, image policy
and the store (read-only: the daemon writes it). The root callback puts a `Runtime` on the
typer context; commands take it from there."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property
from typing import TYPE_CHECKING

import typer
from rich.console import Console

from sparkctl.errors import SparkctlError

if TYPE_CHECKING:  # imported lazily: a CLI call that only asks the daemon must start fast
    from sparkctl.adapters.docker import DockerEngine
    from sparkctl.cli.client import DaemonClient
    from sparkctl.policy.images import ImagePolicy
    from sparkctl.settings import Settings
    from sparkctl.spec.load import Catalog, Invalid
    from sparkctl.state.store import Store
    from sparkctl.wiring import Wiring


@dataclass
class Runtime:
    debug: bool = False

    @property
    def console(self) -> Console:
        from sparkctl.cli.console import out

        return out()

    @cached_property
    def settings(self) -> Settings:
        import os

        from pydantic import ValidationError

        from sparkctl.settings import Settings, invalid

        try:
            settings = Settings()
        except ValidationError as e:
            raise SparkctlError(invalid(e, os.environ)) from None
        return settings

    def configure_logging(self) -> None:
        """For commands that log (the daemon); interactive commands talk through rich."""
        import logging

        from sparkctl import log

        log.configure(secrets=self.settings.secrets(), level=logging.DEBUG if self.debug else logging.INFO)

    @cached_property
    def wiring(self) -> Wiring:
        from sparkctl.wiring import Wiring

        return Wiring(self.settings, on_invalid=self.warn_invalid)

    def warn_invalid(self, invalid: Invalid) -> None:
        """A stack or patch-set file left out of the catalog: said once, on stderr, and the command
        goes on (it fails only if it is about that stack)."""
        from sparkctl.cli.console import say

        built_on = f", with {', '.join(invalid.dependents)} built on it" if invalid.dependents else ""
        say("warning", "yellow", rest=f": {invalid.error} ({invalid.kind} {invalid.name!r} is left out{built_on}; "
                                      "the others load)", stderr=True)

    @cached_property
    def catalog(self) -> Catalog:
        return self.wiring.catalog()

    @cached_property
    def policy(self) -> ImagePolicy:
        return self.wiring.policy()

    @property
    def docker(self) -> DockerEngine:
        return self.wiring.docker

    @cached_property
    def store(self) -> Store:
        """The state store, read-only: the daemon writes it, a command only reads it (a daemon
        is started first where none made it yet)."""
        if not self.settings.store_path.is_file():
            self.daemon  # noqa: B018 - the daemon makes the store at its start
        return self.wiring.open_store(readonly=True)

    @cached_property
    def client(self) -> DaemonClient:
        """The client of this instance's daemon, whether or not one runs."""
        from sparkctl.cli.client import DaemonClient

        return DaemonClient(self.settings.socket_path)

    @cached_property
    def daemon(self) -> DaemonClient:
        """The client of this instance's daemon, started first when none runs: every action runs
        there (detached: `sparkctl service install` runs it under systemd instead)."""
        if self.client.available():  # the common case: one probe, nothing else
            return self.client
        self.settings  # noqa: B018 - settings a daemon would refuse are said here, as this command's error
        if pid := self.client.ensure():
            from sparkctl.cli.client import DAEMON_LOG
            from sparkctl.cli.console import say

            say(f"started the sparkctl daemon (pid {pid}, log {self.client.path.with_name(DAEMON_LOG)}); "
                "`sparkctl daemon --stop` stops it", "dim", stderr=True)
        return self.client


def runtime(ctx: typer.Context) -> Runtime:
    root = ctx.find_root()
    if not isinstance(root.obj, Runtime):
        root.obj = Runtime()
    return root.obj
