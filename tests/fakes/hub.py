"""A local stand-in for the Hugging Face Hub: the part of its HTTP API that `snapshot_download`
and `hf_hub_download` use, served on loopback and selected with `HF_ENDPOINT`.

Routes: model info by revision (`sha`, `siblings`), the file tree of a commit, and file resolve
(HEAD/GET with ETag, X-Repo-Commit, Content-Length, Range). Gated repos answer 401/403 without
the right token. A one-shot fault drops the connection mid-file, to test resume. Used by the
tests and the demo; stdlib only.
"""

from __future__ import annotations

import hashlib
import json
import re
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit


@dataclass
class Repo:
    files: dict[str, bytes]
    gated: bool = False
    # Each file's SHA-1 and SHA-256, by path and the very bytes object: hashing 512 MiB on every
    # request made the download benchmark measure the Hub. Replacing a file's bytes hashes anew.
    _hashes: dict[str, tuple[bytes, str, bytes]] = field(default_factory=dict, repr=False, compare=False)

    @property
    def commit(self) -> str:
        digest = hashlib.sha1()
        for path in sorted(self.files):
            digest.update(path.encode() + b"\0" + self._sha256(path))
        return digest.hexdigest()

    def etag(self, path: str) -> str:
        return self._sha256(path).hex()

    def blob_id(self, path: str) -> str:
        return self._digests(path)[1]

    def _sha256(self, path: str) -> bytes:
        return self._digests(path)[2]

    def _digests(self, path: str) -> tuple[bytes, str, bytes]:
        data = self.files[path]
        held = self._hashes.get(path)
        if held is None or held[0] is not data:
            held = self._hashes[path] = (data, hashlib.sha1(data).hexdigest(), hashlib.sha256(data).digest())
        return held


@dataclass
class Hub:
    """What the server serves; mutate `repos` to publish a new commit under `main`."""

    repos: dict[str, Repo] = field(default_factory=dict)
    token: str = ""  # the one token that opens gated repos
    drop_after: dict[str, int] = field(default_factory=dict)  # path -> bytes sent, then cut (once)
    requests: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def take_drop(self, path: str) -> int | None:
        with self.lock:
            return self.drop_after.pop(path, None)


_INFO = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)(?:/revision/(?P<rev>[^/?]+))?$")
_TREE = re.compile(r"^/api/models/(?P<repo>[^/]+/[^/]+)/tree/(?P<rev>[^/]+)(?:/(?P<sub>.*))?$")
_FILE = re.compile(r"^/(?P<repo>[^/]+/[^/]+)/resolve/(?P<rev>[^/]+)/(?P<path>.+)$")


class _Handler(BaseHTTPRequestHandler):
    hub: Hub
    protocol_version = "HTTP/1.1"
    # A reply's headers and body go out in two writes; with Nagle on, the body waited for the
    # client's delayed ACK: 40 ms on every JSON reply and small file, on loopback.
    disable_nagle_algorithm = True

    def log_message(self, *args: object) -> None:  # quiet: the hub records requests itself
        pass

    def do_HEAD(self) -> None:
        self._route(body=False)

    def do_GET(self) -> None:
        self._route(body=True)

    def _route(self, *, body: bool) -> None:
        path = unquote(urlsplit(self.path).path)
        ranged = self.headers.get("Range")
        self.hub.requests.append(f"{self.command} {path}" + (f" {ranged}" if ranged else ""))
        for pattern, handler in ((_TREE, self._tree), (_INFO, self._info), (_FILE, self._file)):
            match = pattern.match(path)
            if match:
                return handler(body=body, **match.groupdict())
        self._error(404, "RepoNotFound", "no such route")

    def _repo(self, repo: str, rev: str | None) -> Repo | None:
        found = self.hub.repos.get(repo)
        if found is None:
            self._error(404, "RepoNotFound", f"Repository {repo} not found")
            return None
        if found.gated:
            auth = self.headers.get("Authorization", "")
            if not auth:
                self._error(401, "GatedRepo", f"Access to model {repo} is restricted. You must be authenticated.")
                return None
            if auth != f"Bearer {self.hub.token}":
                self._error(403, "GatedRepo", f"Access to model {repo} is restricted: this token is not authorized.")
                return None
        if rev not in (None, "main", found.commit):
            self._error(404, "RevisionNotFound", f"Invalid rev id: {rev}")
            return None
        return found

    def _info(self, *, repo: str, rev: str | None, body: bool) -> None:
        found = self._repo(repo, rev)
        if found:
            self._json({"id": repo, "modelId": repo, "sha": found.commit, "private": False,
                        "gated": "manual" if found.gated else False,
                        "siblings": [{"rfilename": p, "size": len(data), "blobId": found.blob_id(p),
                                      "lfs": {"sha256": found.etag(p), "size": len(data), "pointerSize": 134}}
                                     for p, data in sorted(found.files.items())]}, body=body)

    def _tree(self, *, repo: str, rev: str, sub: str | None, body: bool) -> None:
        found = self._repo(repo, rev)
        if found:
            entries = [{"type": "file", "path": p, "size": len(data), "oid": found.blob_id(p),
                        "lfs": {"oid": found.etag(p), "size": len(data), "pointerSize": 134}}
                       for p, data in sorted(found.files.items()) if not sub or p.startswith(sub.rstrip("/") + "/")]
            self._json(entries, body=body)

    def _file(self, *, repo: str, rev: str, path: str, body: bool) -> None:
        found = self._repo(repo, rev)
        if not found:
            return
        data = found.files.get(path)
        if data is None:
            self._error(404, "EntryNotFound", f"{path} does not exist at revision {rev}")
            return
        start = _range_start(self.headers.get("Range"))
        self.send_response(206 if start else 200)
        headers = {"ETag": f'"{found.etag(path)}"', "X-Repo-Commit": found.commit, "Accept-Ranges": "bytes",
                   "Content-Length": str(len(data) - start), "Content-Type": "application/octet-stream"}
        if start:
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
        for key, value in headers.items():
            self.send_header(key, value)
        self.end_headers()
        if not body:
            return
        cut = self.hub.take_drop(path) if not start else None
        self.wfile.write(data[start:] if cut is None else data[start:start + cut])
        if cut is not None:
            self.wfile.flush()
            self.close_connection = True
            self.connection.close()

    def _json(self, payload: object, *, body: bool) -> None:
        raw = json.dumps(payload).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        if body:
            self.wfile.write(raw)

    def _error(self, status: int, code: str, message: str) -> None:
        raw = json.dumps({"error": message}).encode()
        self.send_response(status)
        self.send_header("X-Error-Code", code)
        self.send_header("X-Error-Message", message)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(raw)))
        self.end_headers()
        if self.command != "HEAD":
            self.wfile.write(raw)


def _range_start(header: str | None) -> int:
    match = re.match(r"bytes=(\d+)-", header or "")
    return int(match[1]) if match else 0


class HubServer:
    """Serve a `Hub` on 127.0.0.1 in a background thread; `endpoint` goes into HF_ENDPOINT."""

    def __init__(self, hub: Hub, *, host: str = "127.0.0.1", port: int = 0) -> None:
        handler = type("Handler", (_Handler,), {"hub": hub})
        self.hub = hub
        self.server = ThreadingHTTPServer((host, port), handler)
        self.server.daemon_threads = True
        self.endpoint = f"http://{host}:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def __enter__(self) -> HubServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
