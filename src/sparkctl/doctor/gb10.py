"""The doctor's checks of what has frozen or hung GB10 hosts in public reports (docs/design.md,
"Unified memory safety"): logind's `RemoveIPC` (a fleet worker's semaphores removed when its SSH
session ends), the driver, the memory the planner divides against MemTotal, swap, the stacks'
`/dev/shm` against the pool, `PYTORCH_CUDA_ALLOC_CONF`, the kernel log the sentinel can read, and
the sentinel's last words of a daemon run that did not stop cleanly. The parsing is pure
(`remove_ipc`); the checks read through `Spark`."""

from __future__ import annotations

import os
from pathlib import Path

from sparkctl.adapters import kernellog
from sparkctl.bench import environment
from sparkctl.deploy.memory import GIB, meminfo, size_bytes, usable
from sparkctl.doctor import Check, ok, warn
from sparkctl.doctor.spark import Spark
from sparkctl.fleet import local
from sparkctl.spec.models import Kind
from sparkctl.state import lastwords

LOGIND = (Path("/etc/systemd/logind.conf"),)
LOGIND_DROPINS = (Path("/usr/lib/systemd/logind.conf.d"), Path("/run/systemd/logind.conf.d"),
                  Path("/etc/systemd/logind.conf.d"))
CUDA_USABLE_GIB = 102.0  # CUDA's free memory at boot on GB10 (MiaAI-Lab/...-2x-DGX-Sparks #47): 101-102 GiB
GB10_TOTAL_GIB = 110.0  # a MemTotal above this is a 128 GB Spark
SHM_SUGGESTED_GIB = 10.0  # what the #31 reporters moved to after 64 GB of /dev/shm was suspected


def remove_ipc(files: list[tuple[Path, str]]) -> tuple[bool, str]:
    """logind's effective RemoveIPC from its config files in the order logind reads them (the
    main file, then the drop-ins by name): the last `RemoveIPC=` of a `[Login]` section wins; unset,
    systemd's default is yes. Returns the value and where it was set."""
    value, where = True, "systemd's default (unset)"
    for path, text in files:
        section = ""
        for raw in text.splitlines():
            line = raw.strip()
            if line.startswith("[") and line.endswith("]"):
                section = line[1:-1]
            elif section == "Login" and line.startswith("RemoveIPC") and "=" in line:
                key, _, setting = line.partition("=")
                if key.strip() == "RemoveIPC":
                    value, where = setting.strip().lower() in ("yes", "true", "1", "on"), str(path)
    return value, where


def logind_files() -> list[tuple[Path, str]]:
    """logind.conf, then its drop-ins sorted by file name (a later directory's file of the same
    name replaces an earlier one's), each with its text."""
    dropins: dict[str, Path] = {}
    for folder in LOGIND_DROPINS:
        if folder.is_dir():
            dropins |= {p.name: p for p in folder.glob("*.conf")}
    paths = [p for p in LOGIND if p.is_file()] + [dropins[name] for name in sorted(dropins)]
    return [(p, p.read_text(errors="replace")) for p in paths]


def logind(spark: Spark, files: list[tuple[Path, str]] | None = None) -> list[Check]:
    removes, where = remove_ipc(logind_files() if files is None else files)
    fleet = spark.settings.fleet_path.exists() or (spark.settings.fleet_dir / local.RECORD_FILE).exists()
    if not removes:
        return [ok("spark", "logind RemoveIPC", f"RemoveIPC=no ({where}): a worker's semaphores outlive its session")]
    detail = (f"RemoveIPC=yes ({where}): logind deletes a user's semaphores and shared memory when their last "
              "session ends; a fleet worker started over SSH by a non-system user then hangs silently "
              "(eugr/spark-vllm-docker #352)")
    fix = "set `RemoveIPC=no` in /etc/systemd/logind.conf.d/sparkctl.conf, then `sudo systemctl restart systemd-logind`"
    return [warn("spark", "logind RemoveIPC", detail, fix) if fleet else
            ok("spark", "logind RemoveIPC", detail + "; this Spark is in no fleet, so it does not matter yet")]


def driver(spark: Spark) -> list[Check]:
    host = environment.host(spark.probe)
    if host["driver"] == environment.UNKNOWN:
        return [warn("spark", "driver", "nvidia-smi is missing or answers nothing: the driver version is unknown",
                     "on a Spark, DGX OS ships the driver: check `nvidia-smi`; elsewhere engines run without a GPU")]
    return [ok("spark", "driver", f"NVIDIA driver {host['driver']}, CUDA {host['cuda']} ({host['gpu']})")]


def usable_memory(spark: Spark) -> list[Check]:
    """What the planner divides (`deploy.memory.usable`: the setting, else CUDA's free memory as the
    daemon last measured it, else MemTotal) against MemTotal. Read only: the daemon measures."""
    total = meminfo("MemTotal", spark.meminfo) / GIB
    planned, source = usable(spark.settings, engines_running=True)
    divided = planned / GIB
    found = f"MemTotal {total:.1f} GiB; the planner divides {divided:.1f} GiB ({source})"
    if total > GB10_TOTAL_GIB and divided > CUDA_USABLE_GIB:
        return [warn("spark", "usable memory", f"{found}, but CUDA's free memory at boot on GB10 has measured "
                     f"101-102 of 121.69 GiB whatever the driver: fractions of {divided:.1f} GiB overcommit",
                     f"set SPARKCTL_MEMORY_TOTAL_GIB={CUDA_USABLE_GIB:g} (or what CUDA reports free at boot)")]
    return [ok("spark", "usable memory", found)]


def swap(spark: Spark) -> list[Check]:
    total = meminfo("SwapTotal", spark.meminfo) / GIB
    free = meminfo("SwapFree", spark.meminfo) / GIB
    if not total:
        return [ok("spark", "swap", "no swap: memory the engines hold is never paged out, and none of the host's is")]
    return [ok("spark", "swap", f"{total:.1f} GiB swap, {total - free:.1f} GiB used: it relieves the host's "
               "pages, never what the GPU holds of unified memory")]


def shm(spark: Spark) -> list[Check]:
    """Each stack's /dev/shm as Docker will give it: the host's own (a tmpfs sized against the same
    pool) under `ipc: host`, else its `shm_size`."""
    checks = []
    host_shm = os.statvfs("/dev/shm") if Path("/dev/shm").is_dir() else None
    host_gib = host_shm.f_blocks * host_shm.f_frsize / GIB if host_shm else 0.0
    for stack in spark.stacks:
        if stack.kind is not Kind.VLLM:
            continue
        name, container = f"shm {stack.name}", stack.container
        if container.ipc == "host":
            checks.append(ok("spark", name, f"ipc: host: the engine shares the host's /dev/shm ({host_gib:.1f} GiB "
                             f"tmpfs, from the same unified pool); shm_size {container.shm_size} does not apply"))
            continue
        size = size_bytes(container.shm_size) / GIB
        if size > SHM_SUGGESTED_GIB:
            checks.append(warn("spark", name, f"shm_size {container.shm_size} ({size:.0f} GiB) comes out of the same "
                               "unified pool as the model; 64 GB was suspected in repeated power-offs "
                               "(DGX-Spark #31), whose reporters moved to 10 GB",
                               f"lower container.shm_size in {stack.name}'s stack file (e.g. 10g)"))
        else:
            checks.append(ok("spark", name, f"shm_size {container.shm_size}, out of the same unified pool"))
    return checks


def alloc_conf(spark: Spark) -> list[Check]:
    """What each stack sets for PyTorch's CUDA allocator: reported, not judged (no public GB10
    report above names a value that helps or hurts)."""
    checks = []
    for stack in spark.stacks:
        if stack.kind is not Kind.VLLM:
            continue
        value = stack.container.env.get("PYTORCH_CUDA_ALLOC_CONF") or spark.settings.engine_env.get(
            "PYTORCH_CUDA_ALLOC_CONF")
        checks.append(ok("spark", f"allocator {stack.name}", f"PYTORCH_CUDA_ALLOC_CONF={value}" if value else
                         "PYTORCH_CUDA_ALLOC_CONF unset: PyTorch's default allocator (set it in container.env "
                         "to try another; the GB10 reports name no value that prevents a wedge)"))
    return checks


def kernel_log(spark: Spark) -> list[Check]:
    source, found = kernellog.probe(spark.settings.kernel_log)
    if source is None:
        return [warn("sentinel", "kernel log", f"the sentinel can read no kernel log: {found}; it watches "
                     "MemAvailable only, and misses the NVRM lines that come before a GB10 wedge",
                     "run the daemon as root or with CAP_SYSLOG (`AmbientCapabilities=CAP_SYSLOG` in its unit), "
                     "or add its user to the adm group")]
    return [ok("sentinel", "kernel log", f"the sentinel {found} for NVRM out-of-memory and Xid lines")]


def last_words(spark: Spark, *, daemon_running: bool) -> list[Check]:
    ending = lastwords.previous(spark.settings.state_dir, daemon_running=daemon_running)
    if ending is None:
        return [ok("sentinel", "last words", "no daemon run ended without stopping cleanly")]
    return [warn("sentinel", "last words", ending.summary(), f"read the records: `tail {ending.path}`; a host that "
                 "froze after NVRM NV_ERR_NO_MEMORY lines needs less memory planned (park or lower a stack)")]
