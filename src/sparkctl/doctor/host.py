"""The doctor's checks of the machine: the Docker engine and compose v2, the NVIDIA runtime and
GPU, memory against the stacks' shares, the daemon and the gateway's port. Each reads what it
judges through `Spark` (doctor/spark.py), once; each returns its `Check`s."""

from __future__ import annotations

import errno
import socket
import stat
from dataclasses import dataclass
from pathlib import Path

from sparkctl.adapters import compose, processes
from sparkctl.bench import environment
from sparkctl.deploy.memory import GIB, meminfo
from sparkctl.doctor import Check, fail, ok, warn
from sparkctl.doctor.spark import Spark
from sparkctl.errors import SparkctlError

NVIDIA_FIX = ("install the NVIDIA Container Toolkit and register it with Docker: `sudo apt install "
              "nvidia-container-toolkit && sudo nvidia-ctk runtime configure --runtime=docker && "
              "sudo systemctl restart docker`")


@dataclass(frozen=True)
class DaemonFacts:
    """This instance's daemon as the CLI finds it (cli/doctor.py reads them)."""

    holder: int | None  # the pid holding the state dir's lock
    answers: bool  # its socket accepts connections
    socket: Path
    units: tuple[Path, ...]  # the systemd unit files written for this instance


def docker(spark: Spark) -> list[Check]:
    facts = spark.engine
    if isinstance(facts, SparkctlError):
        return [fail("docker", "docker", str(facts), "start it (`sudo systemctl start docker`), or point "
                     "SPARKCTL_DOCKER_HOST at the engine; on a new machine `make setup` installs it")]
    return [ok("docker", "docker", f"Docker {facts.version} (API {facts.api_version}), images in {facts.root_dir}")]


def compose_v2(spark: Spark) -> list[Check]:
    try:
        version = compose.version(spark.settings.docker_host)
    except SparkctlError as e:
        return [fail("compose", "compose", f"no Docker Compose v2: {str(e).splitlines()[-1]}",
                     "install compose v2 (`sudo apt install docker-compose` on Debian 13, or Docker's "
                     "docker-compose-plugin)")]
    if not version.lstrip("v").startswith("2"):
        return [fail("compose", "compose", f"Docker Compose {version}: compose stacks need v2",
                     "install compose v2 (Docker's docker-compose-plugin)")]
    return [ok("compose", "compose", f"Docker Compose {version}")]


def nvidia(spark: Spark) -> list[Check]:
    facts = spark.engine
    if isinstance(facts, SparkctlError):
        return []  # the docker check said why
    if "nvidia" in facts.runtimes:
        return [ok("nvidia", "nvidia runtime", "Docker has the nvidia runtime: engines get the GPU")]
    judged = fail if spark.settings.gpus == "all" else warn
    return [judged("nvidia", "nvidia runtime", f"Docker has no nvidia runtime ({', '.join(facts.runtimes)}): "
                   "engines start without the GPU", NVIDIA_FIX)]


def gpu(spark: Spark) -> list[Check]:
    host = environment.host(spark.probe)
    if host["gpu"] == environment.UNKNOWN:
        judged = fail if spark.settings.gpus == "all" else warn
        return [judged("gpu", "gpu", "no NVIDIA GPU found (nvidia-smi is missing or answers nothing)",
                       "install the NVIDIA driver (DGX OS ships it), then check `nvidia-smi`")]
    return [ok("gpu", "gpu", f"{host['gpu']}, driver {host['driver']}, CUDA {host['cuda']}, "
               f"compute capability {host['compute_capability']}")]


def memory(spark: Spark) -> list[Check]:
    """Each stack alone, and the desired stacks awake together, against the memory ceiling."""
    total, available = meminfo("MemTotal", spark.meminfo), meminfo("MemAvailable", spark.meminfo)
    ceiling = spark.settings.memory_ceiling
    found = f"{total / GIB:.1f} GiB in all, {available / GIB:.1f} GiB available now, ceiling {ceiling:.2f}"
    shares = {s.name: s.resources.gpu_memory_utilization for s in spark.stacks}
    checks = [fail("memory", f"memory {name}", f"{found}; {name} alone wants {share:.2f}",
                   f"lower {name}'s resources.gpu_memory_utilization, or raise SPARKCTL_MEMORY_CEILING")
              for name, share in shares.items() if share > ceiling + 1e-9]
    awake = {name: shares[name] for name in spark.desired.stacks
             if name in shares and name not in spark.desired.parked}
    if sum(awake.values()) > ceiling + 1e-9:
        listed = " + ".join(f"{name} {share:.2f}" for name, share in awake.items())
        checks.append(fail("memory", "memory", f"{found}; the desired stacks awake at once want {listed} = "
                           f"{sum(awake.values()):.2f}", "park one (`sparkctl park STACK`), or lower its "
                           "resources.gpu_memory_utilization"))
    return checks or [ok("memory", "memory", f"{found}; every stack fits, and the desired ones awake together "
                         f"want {sum(awake.values()):.2f}")]


def daemon(facts: DaemonFacts) -> list[Check]:
    checks = []
    if facts.holder is None and facts.socket.exists():
        checks.append(warn("daemon", "daemon", f"no daemon runs, and a dead one's socket is left at {facts.socket}",
                           f"none needed: the next daemon replaces it (or `rm {facts.socket}`)"))
    elif facts.holder is None:
        checks.append(ok("daemon", "daemon", "no daemon runs on this state dir; the next command starts one"))
    elif not facts.answers:
        checks.append(fail("daemon", "daemon", f"the daemon (pid {facts.holder}) holds the state dir but its "
                           f"socket {facts.socket} does not answer", "`sparkctl daemon --stop`, then retry"))
    else:
        mode = stat.S_IMODE(facts.socket.stat().st_mode)
        found = f"the daemon (pid {facts.holder}) answers on {facts.socket} (mode {mode:04o})"
        checks.append(ok("daemon", "daemon", found) if mode == 0o600 else
                      fail("daemon", "daemon", found + ": others may use its API", f"`chmod 600 {facts.socket}`"))
    if facts.units:
        checks.append(ok("daemon", "systemd", "units: " + ", ".join(str(u) for u in facts.units)))
    return checks


def port(spark: Spark, facts: DaemonFacts) -> list[Check]:
    s = spark.settings
    family = socket.AF_INET6 if ":" in s.gateway_host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind((s.gateway_host, s.gateway_port))
            return [ok("port", "gateway port", f"{s.gateway_url} is free for the gateway")]
        except OSError as e:
            if e.errno != errno.EADDRINUSE:
                return [fail("port", "gateway port", f"cannot listen on {s.gateway_url}: {e.strerror}",
                             "set SPARKCTL_GATEWAY_HOST to an address of this machine")]
    if facts.holder is not None and facts.holder in {pid for pid, _ in processes.holders(s.gateway_port)}:
        return [ok("port", "gateway port", f"{s.gateway_url} is this instance's gateway")]
    return [fail("port", "gateway port", f"{processes.who_holds(s.gateway_port)} listens on {s.gateway_url}",
                 "stop it, or set SPARKCTL_GATEWAY_PORT to a free port")]

