"""`sparkctl daemon` (foreground) and `sparkctl service install | uninstall` (a systemd unit)."""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

import typer

from sparkctl.cli.runtime import runtime
from sparkctl.errors import SparkctlError

app = typer.Typer(help="Run sparkctl's daemon as a systemd service.", no_args_is_help=True)

UNIT = """[Unit]
Description=sparkctl daemon: keeps LLM serving stacks converged
After=docker.service
Wants=docker.service

[Service]
ExecStart={exe} daemon
Restart=on-failure
RestartSec=2
Environment=SPARKCTL_INSTANCE={instance}
Environment=SPARKCTL_STATE_DIR={state_dir}
Environment=MALLOC_ARENA_MAX=2
# The gateway holds a file per client connection (capped by SPARKCTL_GATEWAY_MAX_CONNECTIONS).
LimitNOFILE=65536
# Engines are separate containers: stopping the daemon leaves them running.
KillMode=process

[Install]
WantedBy={target}
"""


def daemon(ctx: typer.Context) -> None:
    """Run the daemon in the foreground (structured logs; SIGTERM/SIGINT stop it cleanly)."""
    import asyncio

    from sparkctl.daemon.app import Daemon

    if "MALLOC_ARENA_MAX" not in os.environ:
        # glibc gives each thread its own malloc arena; two keep a long-lived daemon's RSS flat.
        os.execve(sys.executable, [sys.executable, "-m", "sparkctl", *sys.argv[1:]],
                  {**os.environ, "MALLOC_ARENA_MAX": "2"})
    rt = runtime(ctx)
    rt.configure_logging()
    if rt.daemon.available():
        raise SparkctlError(f"a daemon already answers on {rt.daemon.path}")
    asyncio.run(Daemon(rt.settings).serve())


@app.command()
def install(ctx: typer.Context,
            user: bool = typer.Option(False, "--user", help="A user unit, not a system one.")) -> None:
    """Write the systemd unit for `sparkctl daemon` and say how to enable it."""
    rt = runtime(ctx)
    path = _unit_path(user)
    exe = shutil.which("sparkctl") or f"{sys.executable} -m sparkctl"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(UNIT.format(exe=exe, instance=rt.settings.instance, state_dir=rt.settings.state_dir,
                                target="default.target" if user else "multi-user.target"))
    flag = " --user" if user else ""
    rt.console.print(f"wrote {path}\nenable it: systemctl{flag} daemon-reload && systemctl{flag} enable --now sparkctl")


@app.command()
def uninstall(ctx: typer.Context, user: bool = typer.Option(False, "--user", help="The user unit.")) -> None:
    """Remove the unit (stop it first: `systemctl [--user] disable --now sparkctl`)."""
    rt = runtime(ctx)
    path = _unit_path(user)
    if not path.exists():
        raise SparkctlError(f"no unit at {path}")
    path.unlink()
    rt.console.print(f"removed {path}; run systemctl{' --user' if user else ''} daemon-reload")


def _unit_path(user: bool) -> Path:
    if user:
        base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
        return base / "systemd" / "user" / "sparkctl.service"
    return Path("/etc/systemd/system/sparkctl.service")
