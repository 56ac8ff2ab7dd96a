"""Secret files in the state dir: a random value made once, readable by the owner only (0600).
The fleet's Ray token (`fleet/local.py`) and the dashboard's key (`gateway/login.py`) are made
here; each checks what it reads in its own terms.
"""

from __future__ import annotations

import os
import secrets
from pathlib import Path


def make(path: Path) -> bool:
    """A fresh 64-hex-digit secret at `path` (0600, its folder 0700), unless a file is there
    already; whether one was made."""
    path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except FileExistsError:
        return False
    with os.fdopen(fd, "w") as out:
        out.write(secrets.token_hex(32))
    return True
