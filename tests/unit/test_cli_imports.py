"""The CLI starts without the heavy libraries: every command pays for what `sparkctl.cli.app`
imports (issue 21's budgets), so the Docker SDK, Ray, the Hub client, pydantic (the settings and
the stack models), the YAML parser, matplotlib, the benchmark tool and the command groups' own
modules load only inside the commands that use them."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("docker", "ray", "huggingface_hub", "matplotlib", "llama_benchy", "aiohttp", "tokenizers", "pydantic",
         "ruamel", "http.client", "rich.table", "sparkctl.cli.fleet", "sparkctl.cli.bench", "sparkctl.cli.stacks")


def test_the_cli_entry_imports_no_heavy_library() -> None:
    probe = ("import sys, sparkctl.cli.app; "
             f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert loaded == [], f"sparkctl.cli.app imports {loaded} at start: import them inside the commands that use them"
