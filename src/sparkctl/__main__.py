"""`python -m sparkctl` runs the CLI."""

from sparkctl.cli.app import command

command()
