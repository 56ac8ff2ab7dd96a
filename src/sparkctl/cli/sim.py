"""`sparkctl sim calibrate RESULTS...`: a sim profile fitted to llama-benchy's results, so the
simulated engine decodes as the measured Spark did (`sim/calibrate.py`)."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from sparkctl.errors import SparkctlError

app = typer.Typer(help="The simulated engine: fit it to your own Spark.", no_args_is_help=True)


@app.command()
def calibrate(
    results: list[Path] = typer.Argument(..., metavar="RESULTS...", help="llama-benchy JSON files "
                                         "(--format json --save-result; seed 000 publishes them in results/)."),
    base: str = typer.Option("qwen36-nvfp4", "--base", help="The profile the rest comes from: load times, "
                             "weights, acceptance, KV density, a draft's cliff."),
    name: str = typer.Option("calibrated", "--name", help="The profile's name, as the sim logs it."),
) -> None:
    """Fit a sim profile to RESULTS' single-stream figures and print it as JSON. Save it and point
    SPARKCTL_SIM_PROFILE_FILE at it: a sim engine then decodes and prefills as measured."""
    from sparkctl.sim import calibrate as fitting
    from sparkctl.sim.profiles import PROFILES

    if base not in PROFILES:
        raise SparkctlError(f"--base {base}: no such profile; one of {', '.join(sorted(PROFILES))}")
    loaded = []
    for path in results:
        try:
            loaded.append(json.loads(path.read_text()))
        except (OSError, ValueError) as e:
            raise SparkctlError(f"{path}: not llama-benchy's JSON ({e})") from None
    try:
        typer.echo(fitting.dumps(fitting.fit(loaded, PROFILES[base], name)))
    except (ValueError, KeyError, TypeError) as e:
        raise SparkctlError(f"{', '.join(map(str, results))}: {e}") from None
