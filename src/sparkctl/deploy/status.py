"""What runs, as rows: one per sparkctl container, joined with the store's latest deployment
and the KV headroom recorded for its build (`kv`: figures, full-context fit, summary, warnings;
None when unknown). Shared by `sparkctl status` (in-process) and the daemon's /v1/status."""

from __future__ import annotations

import time

from sparkctl.adapters.docker import DockerEngine
from sparkctl.answers import StatusRow
from sparkctl.errors import SparkctlError
from sparkctl.spec.load import Catalog
from sparkctl.state.store import Store


def other_instances(docker: DockerEngine) -> dict[str, list[str]]:
    """Other sparkctl instances on this engine and their stacks: mentioned, never touched."""
    others: dict[str, list[str]] = {}
    for c in docker.others():
        others.setdefault(c.instance, []).append(c.stack)
    return {name: sorted(stacks) for name, stacks in sorted(others.items())}


def status_rows(docker: DockerEngine, store: Store, catalog: Catalog) -> list[StatusRow]:
    now = time.time()
    rows = []
    for c in sorted(docker.containers(), key=lambda c: c.stack):
        name = c.stack
        latest = store.deployments.latest(name)
        try:
            endpoint = f"{catalog.stack(name).url}/v1"
        except SparkctlError:
            endpoint = ""
        headroom = store.deployments.headroom(name, c.fingerprint) if c.fingerprint else None
        rows.append(StatusRow(name, latest.phase.value if latest and c.running else c.state, c.state, endpoint,
                              c.fingerprint, c.name, round(now - c.created) if c.running else None, c.memory,
                              latest.error if latest else None, headroom.as_row() if headroom else None))
    return rows
