"""llama-benchy, as `runner.py` starts it: with the endpoint's API key taken from the environment
(`OPENAI_API_KEY`, the name OpenAI clients read) rather than from the command line, which every
local user can read (`ps`). llama-benchy 0.4.0 takes a key only as `--api-key`, so it is added to
the arguments inside this process, whose own command line stays as it was started; the variable is
dropped first, so the commands llama-benchy runs (`--post-run-cmd`) do not inherit it.
"""

from __future__ import annotations

import os
import sys

KEY_ENV = "OPENAI_API_KEY"


def run() -> None:
    from llama_benchy.__main__ import main  # here: the runner reads KEY_ENV without loading llama-benchy

    key = os.environ.pop(KEY_ENV, "")
    sys.argv = ["llama-benchy", *sys.argv[1:], *(["--api-key", key] if key else [])]
    main()


if __name__ == "__main__":
    run()
