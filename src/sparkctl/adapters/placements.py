"""The placement book's file: `placements.json` in the fleet dir, what the fleet's head daemon
keeps of what runs where across hosts. Read once when the daemon starts and written whole,
atomically, on every change (`fleet.placement.Book` holds it in memory and writes through).
Only the head's daemon builds one (`daemon/app.py`): it is the book's one writer, and every
other process asks it (`/v1/fleet/...`)."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

BOOK_FILE = "placements.json"


class PlacementFile:
    def __init__(self, fleet_dir: Path) -> None:
        self.path = fleet_dir / BOOK_FILE

    def load(self) -> dict[str, Any]:
        """The book as last written; {} when nothing was ever placed."""
        try:
            return json.loads(self.path.read_text())
        except FileNotFoundError:
            return {}

    def save(self, book: dict[str, Any]) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        temporary = self.path.with_name(f".{BOOK_FILE}.{os.getpid()}.{threading.get_ident()}")
        temporary.write_text(json.dumps(dict(sorted(book.items())), indent=2))
        temporary.replace(self.path)
