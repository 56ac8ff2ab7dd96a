"""Who may reach the gateway: a request's head is checked, before any of its body is read, for
the Host it was sent to (one of the gateway's own names, against DNS rebinding of a loopback
service) and, when API keys are configured, for a key on the paths that need one (`Bearer KEY`,
or HTTP Basic's password, which is how a browser sends it to the dashboard under /ui), compared
in constant time. A refusal is answered in the OpenAI envelope. The `Gateway` (`proxy.py`) builds
one and hands its `admit` to the connection (`server.py`), which asks it once the head is in.

The OpenAI routes (/v1) are for agents, never for web pages: a page that a browser on the Spark
visits can POST to a loopback port without a CORS preflight, as a form or as `text/plain`, and
the browser says where it came from in `Origin`. Agents send no Origin and send JSON. So a /v1
request whose Origin is not the gateway's own (the Host it was sent to) is refused (403), and so
is a /v1 POST whose body is not declared JSON (415): neither reaches an engine or wakes a stack.
"""

from __future__ import annotations

import base64
import binascii
import hmac
from collections.abc import Sequence
from urllib.parse import urlsplit

from sparkctl.gateway.request import Answer, Request
from sparkctl.gateway.server import error


class Access:
    def __init__(self, api_keys: list[str] | None = None, hosts: Sequence[str] | None = None, *,
                 metrics_key: bool = False) -> None:
        self.api_keys = [k.encode() for k in api_keys or []]
        # The names clients may reach it by (DNS-rebinding protection for a loopback service); None: any.
        self.hosts = {h.lower() for h in hosts} if hosts is not None else None
        self.keyed = ("/v1/", "/ui", "/metrics") if metrics_key else ("/v1/", "/ui")

    def admit(self, request: Request) -> Answer | None:
        """Checked when a request's head is complete, before any of its body is read."""
        host = request.headers.get("host")
        if self.hosts is not None and host is not None and _hostname(host) not in self.hosts:
            return lambda conn: error(conn, 421, f"Host {host[:60]!r} is not one of this gateway's names "
                                      "(SPARKCTL_GATEWAY_HOSTNAMES)", "misdirected_request")
        if self.api_keys and request.path.startswith(self.keyed) and not self._authorized(request):
            ask = [("WWW-Authenticate", 'Basic realm="sparkctl", charset="UTF-8"')] if in_ui(request.path) else []
            return lambda conn: error(conn, 401, "missing or wrong API key", "invalid_api_key", headers=ask)
        if request.path.startswith("/v1/"):
            return _from_a_page(request)
        return None

    def _authorized(self, request: Request) -> bool:
        """A key as `Bearer KEY`, or as HTTP Basic's password (how a browser sends it to /ui)."""
        scheme, _, given = request.headers.get("authorization", "").partition(" ")
        secret = given.strip().encode("latin-1")
        if scheme.lower() == "basic":
            try:
                secret = base64.b64decode(secret, validate=True).partition(b":")[2]
            except binascii.Error:
                return False
        elif scheme.lower() != "bearer":
            return False
        return any(hmac.compare_digest(secret, key) for key in self.api_keys)


def in_ui(path: str) -> bool:
    return path == "/ui" or path.startswith("/ui/")


def same_origin(origin: str, host: str) -> bool:
    """Whether an `Origin` header names the server the request was sent to (its `Host`)."""
    try:
        netloc = urlsplit(origin).netloc.lower()
    except ValueError:  # not a URL (`http://[::1`)
        return False
    return bool(netloc) and netloc == host.strip().lower()


def _from_a_page(request: Request) -> Answer | None:
    """Refuse an OpenAI request a web page could have sent: another site's Origin, or a body
    that is not declared JSON (`application/json`, parameters allowed)."""
    origin = request.headers.get("origin")
    if origin is not None and not same_origin(origin, request.headers.get("host", "")):
        return lambda conn: error(conn, 403, f"Origin {origin[:80]!r} is not this gateway: the OpenAI routes are for "
                                  "agents, not web pages", "forbidden")
    kind = request.headers.get("content-type", "")
    if request.method == "POST" and kind.partition(";")[0].strip().lower() != "application/json":
        return lambda conn: error(conn, 415, f"Content-Type {kind[:60]!r}: the body must be JSON "
                                  "(Content-Type: application/json)", "unsupported_media_type")
    return None


def _hostname(host: str) -> str:
    """The name in a Host header, without its port (`[::1]:8000` -> `[::1]`)."""
    host = host.strip().lower()
    if host.startswith("["):
        return host.partition("]")[0] + "]"
    return host.rpartition(":")[0] if host.count(":") == 1 else host
