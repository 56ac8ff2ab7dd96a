"""`ray start` with the one port Ray 2.60 keeps from its raylet: the dashboard agent's listen port.

`ray start --dashboard-agent-listen-port=N` hands N to the agent only, so the raylet waits a fixed
15 s (no setting reaches it) for the agent to write its port to a file, and aborts when it has not.
The agent imports every dashboard module before it writes, which a loaded machine can stretch past
15 s: the node then fails to start. Told the port, the raylet waits for nothing and the agent
comes up at its own pace. `raynode.start` runs this as `python -m sparkctl.adapters.raystart start
ARGS`, with `ray start`'s own arguments; it imports `ray`, like the adapter's child (`raychild.py`).
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from typing import Any

LISTEN = "--dashboard-agent-listen-port="


def telling_the_raylet(start: Callable[..., Any], port: str) -> Callable[..., Any]:
    """Ray's process starter, giving the raylet's command line the agent's listen port."""
    from ray._private import ray_constants

    def start_ray_process(command: list[str], process_type: str, *args: Any, **kwargs: Any) -> Any:
        if process_type == ray_constants.PROCESS_TYPE_RAYLET:
            command = [*command, f"--dashboard_agent_listen_port={port}"]
        return start(command, process_type, *args, **kwargs)

    return start_ray_process


if __name__ == "__main__":
    from ray._private import services
    from ray.scripts.scripts import main

    port = next(arg.removeprefix(LISTEN) for arg in sys.argv if arg.startswith(LISTEN))
    services.start_ray_process = telling_the_raylet(services.start_ray_process, port)
    sys.argv[0] = "ray"
    sys.exit(main())
