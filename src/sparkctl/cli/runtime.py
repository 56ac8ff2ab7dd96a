"""What every command needs, built once per invocation: settings, catalog, image policy.

The root callback puts a `Runtime` on the typer context; commands take it from there. This
is the one place settings are read from the environment.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from functools import cached_property

import typer
from pydantic import ValidationError
from rich.console import Console

from sparkctl import log
from sparkctl.errors import SparkctlError
from sparkctl.policy.images import ImagePolicy
from sparkctl.settings import Settings
from sparkctl.spec.load import Catalog, load_catalog


@dataclass
class Runtime:
    debug: bool = False

    @cached_property
    def console(self) -> Console:
        return Console(highlight=False)

    @cached_property
    def settings(self) -> Settings:
        try:
            settings = Settings()
        except ValidationError as e:
            first = e.errors()[0]
            name = "SPARKCTL_" + ".".join(str(p) for p in first["loc"]).upper()
            raise SparkctlError(f"setting {name} is invalid: {first['msg']}") from None
        log.configure(secrets=settings.secrets(), level=logging.DEBUG if self.debug else logging.INFO)
        return settings

    @cached_property
    def catalog(self) -> Catalog:
        return load_catalog(self.settings.stacks_dir, self.settings.patches_dir)

    @cached_property
    def policy(self) -> ImagePolicy:
        from sparkctl.spec.imagefile import load_policy

        return load_policy(self.settings.images_file)


def runtime(ctx: typer.Context) -> Runtime:
    root = ctx.find_root()
    if not isinstance(root.obj, Runtime):
        root.obj = Runtime()
    return root.obj
