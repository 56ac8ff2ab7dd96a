"""`python -m sparkctl` runs the CLI."""

from sparkctl.cli.main import command

command()
