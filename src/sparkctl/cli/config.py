"""`sparkctl config show`: the effective settings, secrets masked."""

from __future__ import annotations

import json

import typer
from rich.table import Table

from sparkctl.cli.runtime import runtime

app = typer.Typer(help="Show sparkctl's settings (SPARKCTL_* variables and .env).", no_args_is_help=True)


@app.command("show")
def show(ctx: typer.Context, as_json: bool = typer.Option(False, "--json", help="Print JSON.")) -> None:
    """Print every setting with its effective value; secrets are masked."""
    rt = runtime(ctx)
    values = rt.settings.masked()
    if as_json:
        print(json.dumps(values, indent=2, default=str))
        return
    from sparkctl.settings import env_names

    table = Table("setting", "variable", "value")
    for name, value in values.items():
        table.add_row(name, " or ".join(env_names(name)), "" if value is None else str(value))
    rt.console.print(table)
