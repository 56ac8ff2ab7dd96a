"""The CLI starts without the heavy libraries: every command pays for what `sparkctl.cli.app`
imports (issue 21's `stacks list` budget), so the Docker SDK, Ray, the Hub client, matplotlib
and the benchmark tool load only inside the commands that use them."""

from __future__ import annotations

import subprocess
import sys

HEAVY = ("docker", "ray", "huggingface_hub", "matplotlib", "llama_benchy", "aiohttp", "tokenizers")


def test_the_cli_entry_imports_no_heavy_library() -> None:
    probe = ("import sys, sparkctl.cli.app; "
             f"print(' '.join(m for m in {HEAVY!r} if m in sys.modules))")
    loaded = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert loaded == [], f"sparkctl.cli.app imports {loaded} at start: import them inside the commands that use them"
