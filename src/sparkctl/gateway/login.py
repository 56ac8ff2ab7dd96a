"""The dashboard owner's credential: a key only the owner can read, one-time login codes made
from it, and the browser sessions those codes open.

The key is 32 random bytes made at the daemon's first start, kept 0600 in the state dir
(`dashboard.key`). `sparkctl dashboard` (the owner, who can read the file) makes a login code and
prints the URL that carries it; the dashboard (`ui.py`) trades a valid, unexpired, unused code,
made during this run of the daemon, for a session, which the page keeps in its origin's storage
and sends with every action. Codes and sessions are HMACs of the key, so nothing is kept per
browser: loading the page any number of times evicts nobody, and a new key (delete the file,
restart the daemon) ends every session. The codes used are remembered only while the daemon runs;
a code made before it started is refused, so a restart cannot make a used one good again.
Anything else on the host, a model container included, can load the page and read, but cannot act.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import time
from pathlib import Path

from sparkctl.errors import SparkctlError
from sparkctl.state import secret

CODE_TTL = 300.0  # seconds a login URL stays good
SESSION_TTL = 30 * 86400.0  # seconds a browser stays logged in


def ensure_key(path: Path) -> bytes:
    """The key at `path`, made (0600) if there is none yet."""
    secret.make(path)
    return read_key(path)


def read_key(path: Path) -> bytes:
    try:
        key = path.read_text().strip()
    except OSError as e:
        raise SparkctlError(f"cannot read the dashboard key {path} ({e.strerror}); run sparkctl as the daemon's "
                            "user") from None
    if len(key) < 32:
        raise SparkctlError(f"the dashboard key {path} is too short: delete it and restart the daemon")
    return key.encode()


def login_code(key: bytes, now: float | None = None) -> str:
    """A code that opens one session, once, within `CODE_TTL`."""
    return _signed(key, "login", (time.time() if now is None else now) + CODE_TTL)


class Logins:
    """Checks codes and sessions against the key; remembers the codes used in this run until they
    expire (each opens one session). Built once per run of the daemon: `started` is that run's start."""

    def __init__(self, key: bytes, clock=time.time) -> None:
        self.key, self.clock = key, clock
        self.started = clock()
        self.used: dict[str, float] = {}  # code -> its expiry

    def open_session(self, code: str) -> str | None:
        """A new session for a good code made in this run and not used before; None otherwise."""
        now = self.clock()
        self.used = {c: until for c, until in self.used.items() if until >= now}
        until = _verify(self.key, "login", code, now)
        if until is None or until - CODE_TTL < self.started - 0.001 or code in self.used:  # to the ms
            return None
        self.used[code] = until
        return _signed(self.key, "session", now + SESSION_TTL)

    def valid(self, session: str) -> bool:
        return _verify(self.key, "session", session, self.clock()) is not None


def _signed(key: bytes, purpose: str, until: float) -> str:
    body = f"{int(until * 1000)}.{secrets.token_urlsafe(12)}"  # milliseconds: a code's age is judged to them
    return f"{body}.{_mac(key, f'{purpose}.{body}')}"


def _verify(key: bytes, purpose: str, value: str, now: float) -> float | None:
    """The expiry of a value signed for `purpose`, if it is genuine and not expired."""
    body, _, mac = value.rpartition(".")
    expiry = body.partition(".")[0]
    if not expiry.isdigit() or not hmac.compare_digest(mac.encode(), _mac(key, f"{purpose}.{body}").encode()):
        return None
    return int(expiry) / 1000 if int(expiry) / 1000 >= now else None


def _mac(key: bytes, text: str) -> str:
    return hmac.new(key, text.encode(), hashlib.sha256).hexdigest()[:40]
