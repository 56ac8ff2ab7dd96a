"""What runs, as rows: one per sparkctl container, joined with the store's latest deployment.
Shared by `sparkctl status` (in-process) and the daemon's /v1/status."""

from __future__ import annotations

import time
from typing import Any

from sparkctl import instance as instances
from sparkctl.adapters.docker import DockerEngine
from sparkctl.errors import SparkctlError
from sparkctl.spec.load import Catalog
from sparkctl.spec.render import LABEL_FINGERPRINT, LABEL_MEMORY, LABEL_STACK
from sparkctl.state.store import Store


def other_instances(docker: DockerEngine) -> dict[str, list[str]]:
    """Other sparkctl instances on this engine and their stacks: mentioned, never touched."""
    others: dict[str, list[str]] = {}
    for c in docker.others():
        others.setdefault(c["Labels"].get(instances.LABEL, instances.DEFAULT), []).append(c["Labels"][LABEL_STACK])
    return {name: sorted(stacks) for name, stacks in sorted(others.items())}


def status_rows(docker: DockerEngine, store: Store, catalog: Catalog) -> list[dict[str, Any]]:
    now = time.time()
    rows = []
    for c in sorted(docker.containers(), key=lambda c: c["Labels"][LABEL_STACK]):
        labels, name = c["Labels"], c["Labels"][LABEL_STACK]
        latest = store.latest(name)
        try:
            endpoint = f"http://127.0.0.1:{catalog.stack(name).port}/v1"
        except SparkctlError:
            endpoint = ""
        rows.append({"stack": name, "phase": latest.phase.value if latest and c["State"] == "running" else c["State"],
                     "state": c["State"], "endpoint": endpoint, "fingerprint": labels.get(LABEL_FINGERPRINT),
                     "container": c["Names"][0].lstrip("/"),
                     "uptime_s": round(now - c["Created"]) if c["State"] == "running" else None,
                     "memory": float(labels[LABEL_MEMORY]) if labels.get(LABEL_MEMORY) else None,
                     "error": latest.error if latest else None})
    return rows
