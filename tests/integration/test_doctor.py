"""`sparkctl doctor` against the real Docker engine, compose, the loopback registry and the local
Hub, and against faults made here: no Docker, no compose, a full disk, a registry that refuses,
a gated repo without a token, a stale socket, a port taken. Each fault fails (or warns) on its own
line, names its fix, and leaves every other check answering."""

from __future__ import annotations

import json
import os
import socket
import subprocess
from pathlib import Path

import pytest

from tests.conftest import HUB_TOKEN


def doctor(cli, *args: str) -> tuple[int, dict[str, dict]]:
    code, out, err = cli("doctor", *args, "--json")
    report = json.loads(out)
    assert report["ok"] == (code == 0), (code, err)
    return code, {c["name"]: c for c in report["checks"]}


def test_a_ready_spark_passes_every_check_but_the_gpu(world, cli, monkeypatch) -> None:
    monkeypatch.setenv("SPARKCTL_HF_TOKEN", HUB_TOKEN)
    code, out, _ = cli("doctor", "qwen36-dflash", "diffusiongemma", "--json")
    assert HUB_TOKEN not in out
    report = {c["name"]: c for c in json.loads(out)["checks"]}
    assert code == 0, report
    assert report["docker"]["status"] == "ok" and "Docker " in report["docker"]["detail"]
    assert report["compose"]["status"] == "ok" and report["compose"]["detail"].startswith("Docker Compose 2")
    assert report["nvidia runtime"]["status"] == "warn" and "nvidia-ctk" in report["nvidia runtime"]["fix"]
    registry = report["image ghcr.io/aeon-7/aeon-vllm-ultimate:2026-06-18-v0.23.0-dflashfix"]
    assert registry["status"] == "ok" and registry["detail"].startswith("127.0.0.1:")  # the mirror
    assert "GB compressed" in registry["detail"]
    both = report["memory"]  # each fits alone; none is desired yet
    assert both["status"] == "ok" and "want 0.00" in both["detail"]
    assert report["hub nvidia/diffusiongemma-26B-A4B-it-NVFP4"]["status"] == "ok"  # gated: the token may read it
    assert "with the HF token" in report["hub AEON-7/Qwen3.6-27B-AEON-Ultimate-Uncensored-NVFP4"]["detail"]
    assert report["stack qwen36-dflash"]["status"] in ("ok", "warn")
    disk = [c for name, c in report.items() if name.startswith("disk ")]
    assert disk and all(c["status"] == "ok" and "to fetch" in c["detail"] for c in disk)
    assert report["daemon"]["status"] == "ok" and report["gateway port"]["status"] == "ok"


def test_no_docker_fails_its_check_and_the_rest_still_answer(world, cli, monkeypatch, tmp_path: Path) -> None:
    monkeypatch.setenv("SPARKCTL_DOCKER_HOST", f"unix://{tmp_path}/no-docker.sock")
    code, report = doctor(cli, "qwen36-dflash", "--only", "docker,nvidia,hub,port")
    assert code == 1 and report["docker"]["status"] == "fail"
    assert "cannot reach the Docker engine" in report["docker"]["detail"]
    assert "systemctl start docker" in report["docker"]["fix"]
    assert "nvidia runtime" not in report  # said once, by the docker check
    assert report["hub AEON-7/Qwen3.6-27B-AEON-Ultimate-Uncensored-NVFP4"]["status"] == "ok"
    assert report["gateway port"]["status"] == "ok"


def test_no_compose_v2(world, cli, monkeypatch, tmp_path: Path) -> None:
    """A `docker` whose compose plugin is missing says what the real CLI says then."""
    shim = tmp_path / "bin"
    shim.mkdir()
    real = subprocess.run(["sh", "-c", "command -v docker"], capture_output=True, text=True).stdout.strip()
    (shim / "docker").write_text(f'#!/bin/sh\n[ "$1" = compose ] && {{ echo "docker: \'compose\' is not a docker '
                                 f'command." >&2; exit 1; }}\nexec {real} "$@"\n')
    (shim / "docker").chmod(0o755)
    monkeypatch.setenv("PATH", f"{shim}:{os.environ['PATH']}")
    code, report = doctor(cli, "--only", "docker,compose")
    assert code == 1 and report["docker"]["status"] == "ok"
    assert report["compose"]["status"] == "fail" and "'compose' is not a docker command" in report["compose"]["detail"]
    assert "docker-compose" in report["compose"]["fix"]


def test_a_full_disk_names_what_does_not_fit(world, cli, monkeypatch, tmp_path: Path) -> None:
    small = tmp_path / "small"
    small.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(small)], check=True)
    monkeypatch.setenv("SPARKCTL_HF_CACHE_DIR", str(small / "hub"))
    try:
        code, report = doctor(cli, "qwen36-dflash", "--only", "disk")
    finally:
        subprocess.run(["umount", str(small)], check=True)
    failed = report[f"disk {small}"]
    assert code == 1 and failed["status"] == "fail"
    assert "AEON-7/Qwen3.6-27B-AEON-Ultimate-Uncensored-NVFP4" in failed["detail"] and "GB free" in failed["detail"]
    assert "SPARKCTL_HF_CACHE_DIR" in failed["fix"]


def test_a_registry_that_refuses(world, cli, monkeypatch) -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]  # nothing listens there once closed
    monkeypatch.setenv("SPARKCTL_REGISTRY_MIRRORS", f"ghcr.io=127.0.0.1:{port}")
    code, report = doctor(cli, "qwen36-dflash", "--only", "registry,disk")
    refused = report["image ghcr.io/aeon-7/aeon-vllm-ultimate:2026-06-18-v0.23.0-dflashfix"]
    assert code == 1 and refused["status"] == "fail" and "refused" in refused["detail"].lower()
    assert refused["detail"].startswith(f"127.0.0.1:{port} did not answer")  # the host, and how
    assert "SPARKCTL_REGISTRY_MIRRORS" in refused["fix"]


def test_a_gated_repo_without_a_token(world, cli) -> None:
    code, report = doctor(cli, "diffusiongemma", "--only", "hub")
    gated = report["hub nvidia/diffusiongemma-26B-A4B-it-NVFP4"]
    assert code == 1 and gated["status"] == "fail" and "without an HF token" in gated["detail"]
    assert "SPARKCTL_HF_TOKEN" in gated["fix"]


def test_a_stale_socket_and_a_taken_port(world, cli, monkeypatch) -> None:
    state = world / "state"
    state.mkdir(exist_ok=True)
    with socket.socket(socket.AF_UNIX) as dead:
        dead.bind(str(state / "sparkctl.sock"))  # left behind: no daemon holds the lock
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", int(os.environ["SPARKCTL_GATEWAY_PORT"])))
        taken.listen()
        code, report = doctor(cli, "--only", "daemon,port")
    assert report["daemon"]["status"] == "warn" and "dead one's socket" in report["daemon"]["detail"]
    assert code == 1 and report["gateway port"]["status"] == "fail"
    assert "SPARKCTL_GATEWAY_PORT" in report["gateway port"]["fix"]


def test_the_running_daemons_gateway_is_ours(world, cli, start_daemon) -> None:
    start_daemon()
    code, report = doctor(cli, "--only", "daemon,port")
    assert code == 0, report
    assert "answers on" in report["daemon"]["detail"] and "(mode 0600)" in report["daemon"]["detail"]
    assert report["gateway port"]["detail"].endswith("is this instance's gateway")


@pytest.mark.parametrize("area", ["nosuch"])
def test_an_unknown_area_is_refused(world, cli, area: str) -> None:
    code, _, err = cli("doctor", "--only", area)
    assert code == 1 and "no check area nosuch" in err and "docker" in err


def test_an_offline_spark_is_named_as_such_and_its_disk_still_reported(world, cli, monkeypatch) -> None:
    """No network: the registry's and the Hub's names do not resolve. Each check says which host
    and the setting that points elsewhere (not "the check itself failed"); free disk is local, so it
    is reported, naming what could not be sized; in the table each fix is a row of its own."""
    monkeypatch.setenv("SPARKCTL_REGISTRY_MIRRORS", "ghcr.io=registry.nosuch.invalid:5000")
    monkeypatch.setenv("SPARKCTL_HF_ENDPOINT", "http://hub.nosuch.invalid")
    code, report = doctor(cli, "qwen36-dflash", "--only", "registry,hub,disk")
    image = report["image ghcr.io/aeon-7/aeon-vllm-ultimate:2026-06-18-v0.23.0-dflashfix"]
    assert image["status"] == "fail" and image["detail"].startswith("registry.nosuch.invalid:5000 does not resolve")
    assert "offline" in image["detail"] and "SPARKCTL_REGISTRY_MIRRORS" in image["fix"]
    assert "SPARKCTL_REGISTRY_MIRRORS" not in image["detail"]  # said once, in the fix
    hub = report["hub AEON-7/Qwen3.6-27B-AEON-Ultimate-Uncensored-NVFP4"]
    assert hub["status"] == "fail" and "hub.nosuch.invalid does not resolve" in hub["detail"], hub
    assert "SPARKCTL_HF_ENDPOINT" in hub["fix"]
    assert not any("the check itself failed" in c["detail"] for c in report.values()), report
    disk = [c for n, c in report.items() if n.startswith("disk ")]
    assert disk and all("GB free" in c["detail"] for c in disk), disk
    unsized = " ".join(c["detail"] for c in disk)
    assert "could not be sized" in unsized and "aeon-vllm-ultimate" in unsized
    assert "AEON-7/Qwen3.6-27B-AEON-Ultimate-Uncensored-NVFP4" in unsized
    code, out, _ = cli("doctor", "qwen36-dflash", "--only", "registry,hub,disk")
    fixes = [line for line in out.splitlines() if "fix:" in line]
    assert fixes and all(not line.split("fix:")[0].strip() for line in fixes), out


def test_an_unpinned_image_names_the_real_bench_command(world, cli) -> None:
    (world / "stacks" / "unpinned.yaml").write_text(
        "name: unpinned\nextends: qwen36-nvfp4-stock\n"
        "image:\n  repository: docker.io/vllm/vllm-openai\n  tag: v0.99.0\n")
    _, report = doctor(cli, "unpinned", "--only", "stacks")
    check = report["stack unpinned"]
    assert check["status"] == "warn" and "not pinned" in check["detail"], check
    assert "`sparkctl bench run unpinned`" in check["fix"]


def test_a_taken_port_at_the_daemons_start_names_the_program(world, cli) -> None:
    """Any command that starts the daemon while another program listens on the gateway's port."""
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", int(os.environ["SPARKCTL_GATEWAY_PORT"])))
        taken.listen()
        code, _, err = cli("status")
    assert code == 1 and "internal error" not in err and "OSError" not in err, err
    assert f"pid {os.getpid()}" in err and "SPARKCTL_GATEWAY_PORT" in err, err


def test_the_gb10_checks_and_a_kernel_log_the_sentinel_cannot_read(world, cli, monkeypatch) -> None:
    code, report = doctor(cli, "qwen36-dflash", "--only", "spark,sentinel")
    assert code == 0, report
    for check in ("logind RemoveIPC", "driver", "usable memory", "swap", "shm qwen36-dflash",
                  "allocator qwen36-dflash", "kernel log", "last words"):
        assert check in report, (check, report)
    assert report["driver"]["status"] == "warn" and "nvidia-smi" in report["driver"]["detail"]  # no GPU here
    assert report["kernel log"]["status"] == "ok" and str(world / "kmsg") in report["kernel log"]["detail"]
    assert report["shm qwen36-dflash"]["detail"].startswith("ipc: host")  # the host's /dev/shm, not shm_size
    monkeypatch.setenv("SPARKCTL_KERNEL_LOG", str(world / "no-such-log"))
    _, report = doctor(cli, "--only", "sentinel")
    assert report["kernel log"]["status"] == "warn" and "can read no kernel log" in report["kernel log"]["detail"]
    assert "CAP_SYSLOG" in report["kernel log"]["fix"]
