"""`sparkctl daemon` (foreground), `sparkctl dashboard` (the owner's login URL) and `sparkctl
service install | uninstall` (systemd units).

The service comes with a socket unit that holds the gateway's listening socket: systemd keeps it
open across a restart of the daemon (an upgrade, `systemctl restart`), so an agent connecting
meanwhile waits in its queue, and the stopping daemon finishes the requests it has accepted.
"""

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
After=docker.service {name}.socket
Wants=docker.service
Requires={name}.socket

[Service]
# The daemon says READY=1 once its API and gateway listen: `systemctl start` returns then.
Type=notify
NotifyAccess=main
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
# Stopping waits for the gateway's accepted requests (SPARKCTL_SWITCH_DRAIN_TIMEOUT).
TimeoutStopSec={stop_timeout}

[Install]
WantedBy={target}
"""

SOCKET = """[Unit]
Description=sparkctl gateway socket, held across daemon restarts

[Socket]
ListenStream={address}
NoDelay=true
Backlog=4096

[Install]
WantedBy=sockets.target
"""


def daemon(ctx: typer.Context,
           stop: bool = typer.Option(False, "--stop", help="Stop the daemon running on this instance (its "
                                                           "engines keep running; the next one adopts them).")
           ) -> None:
    """Run the daemon in the foreground (structured logs; SIGTERM/SIGINT stop it cleanly). Any
    other command starts one in the background when none runs."""
    client = runtime(ctx).client
    if stop:
        pid = client.stop()
        typer.echo(f"stopped the daemon (pid {pid})" if pid else f"no daemon runs on {client.path.parent}")
        return
    if "MALLOC_ARENA_MAX" not in os.environ:
        # glibc gives each thread its own malloc arena; two keep a long-lived daemon's RSS flat.
        os.execve(sys.executable, [sys.executable, "-m", "sparkctl", *sys.argv[1:]],
                  {**os.environ, "MALLOC_ARENA_MAX": "2"})
    import asyncio

    from sparkctl.daemon import app, process

    rt = runtime(ctx)
    rt.configure_logging()
    holder = client.holder()
    if holder is not None:
        raise process.already_runs(holder, client.path.parent)
    asyncio.run(app.run(rt.settings))


def dashboard(ctx: typer.Context) -> None:
    """Print a one-time login URL for the dashboard (the daemon serves it: started if none runs):
    open it in a browser on this Spark (good for 5 minutes, once); the browser can then act (up,
    down, park, switch) for 30 days."""
    from sparkctl.gateway.login import CODE_TTL, ensure_key, login_code

    rt = runtime(ctx)
    rt.daemon  # noqa: B018 - it serves the page the URL names
    settings = rt.settings
    code = login_code(ensure_key(settings.dashboard_key_path))
    typer.echo(f"{settings.gateway_url}/ui/login?code={code}")
    typer.echo(f"(one use, within {CODE_TTL / 60:g} minutes; reading the dashboard needs no login: "
               f"{settings.gateway_url}/ui)", err=True)


@app.command()
def install(ctx: typer.Context,
            user: bool = typer.Option(False, "--user", help="A user unit, not a system one.")) -> None:
    """Write the systemd units for `sparkctl daemon` (service + gateway socket); say how to enable them."""
    rt = runtime(ctx)
    s = rt.settings
    path = _unit_path(user, s.instance)
    exe = shutil.which("sparkctl") or f"{sys.executable} -m sparkctl"
    path.parent.mkdir(parents=True, exist_ok=True)
    host = f"[{s.gateway_host}]" if ":" in s.gateway_host else s.gateway_host
    path.write_text(UNIT.format(exe=exe, name=path.stem, instance=s.instance, state_dir=s.state_dir,
                                stop_timeout=int(s.switch_drain_timeout) + 30,
                                target="default.target" if user else "multi-user.target"))
    path.with_suffix(".socket").write_text(SOCKET.format(address=f"{host}:{s.gateway_port}"))
    flag = " --user" if user else ""
    rt.console.print(f"wrote {path} and {path.with_suffix('.socket')}\nenable them: systemctl{flag} daemon-reload && "
                     f"systemctl{flag} enable --now {path.stem}.socket {path.stem}.service")


@app.command()
def uninstall(ctx: typer.Context, user: bool = typer.Option(False, "--user", help="The user unit.")) -> None:
    """Remove the units (stop them first: `systemctl [--user] disable --now sparkctl.socket sparkctl`)."""
    rt = runtime(ctx)
    path = _unit_path(user, rt.settings.instance)
    if not path.exists():
        raise SparkctlError(f"no unit at {path}")
    path.unlink()
    path.with_suffix(".socket").unlink(missing_ok=True)
    rt.console.print(f"removed {path}; run systemctl{' --user' if user else ''} daemon-reload")


def unit_paths(instance: str) -> tuple[Path, Path]:
    """Where this instance's service unit is written: the system one, then the user one."""
    return _unit_path(False, instance), _unit_path(True, instance)


def _unit_path(user: bool, instance: str) -> Path:
    name = "sparkctl.service" if instance == "default" else f"sparkctl-{instance}.service"
    if user:
        base = Path(os.environ.get("XDG_CONFIG_HOME") or Path.home() / ".config")
        return base / "systemd" / "user" / name
    return Path("/etc/systemd/system") / name
