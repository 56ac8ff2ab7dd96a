"""The bind check judges the path the host will mount, not its spelling: `/proc/self/root/run`,
a symlink to `/run` and `/var/run/..` are what they resolve to; the host's system folders and
any folder holding a socket are refused even with `allow:`; outside sparkctl's own folders a
path needs `allow: [host-path]`, and the container is given the resolved path."""

from __future__ import annotations

import os
import socket
from pathlib import Path

import pytest

from sparkctl.deploy.binds import BindError, checked, judge
from sparkctl.spec.render import MountPlan

# Host paths that reach the host's system folders (the Docker socket among them), however spelled.
SYSTEM = ["/run", "/var/run", "/var/run/..", "/proc/self/root/run", "/proc/self/root/var/run", "/proc/1/root/run",
          "/proc/self/root", "/", "//", "/var", "/var/lib/docker", "/etc", "/etc/..", "/proc", "/sys", "/dev",
          "/proc/self/cwd/../../run"]


@pytest.mark.parametrize("source", SYSTEM)
@pytest.mark.parametrize("allow", [(), ("host-path",), ("host-path", "docker-socket")])
def test_the_hosts_system_folders_are_refused_whatever_the_stack_allows(source: str, allow: tuple[str, ...],
                                                                        tmp_path: Path) -> None:
    with pytest.raises(BindError, match=r"draft\.path: .*which sparkctl never mounts"):
        judge(source, where="draft.path", owned=[tmp_path], allow=allow)


def test_a_link_to_run_is_judged_as_run(tmp_path: Path) -> None:
    (tmp_path / "weights").symlink_to("/run")
    with pytest.raises(BindError, match=rf"{tmp_path}/weights \(on this host: /run\) is or holds the host's /run"):
        judge(str(tmp_path / "weights"), where="model.path", owned=[tmp_path], allow=["host-path"])


@pytest.mark.parametrize("allow", [(), ("host-path",), ("docker-socket", "host-path")])
def test_a_folder_holding_a_socket_is_refused(allow: tuple[str, ...], tmp_path: Path) -> None:
    folder = tmp_path / "models"
    (folder / "deep").mkdir(parents=True)
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(folder / "deep" / "docker.sock"))
        for source in (folder, tmp_path / "models" / "deep", tmp_path / "models" / "deep" / "docker.sock"):
            if "docker-socket" in allow and source.name == "docker.sock":
                continue  # the socket itself, opted into: below
            with pytest.raises(BindError, match=r"holds a socket \(.*/deep/docker.sock\)"):
                judge(str(source), where="container.mounts[0].source", owned=[tmp_path], allow=allow)


def test_the_docker_socket_itself_is_what_docker_socket_allows(tmp_path: Path) -> None:
    sock = tmp_path / "docker.sock"
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(str(sock))
        assert judge(str(sock), where="m", owned=[], allow=["docker-socket"]) == str(sock)
        with pytest.raises(BindError, match="holds a socket"):
            judge(str(sock), where="m", owned=[tmp_path], allow=["host-path"])


@pytest.mark.skipif(not os.path.exists("/run/docker.sock"), reason="no Docker socket at /run/docker.sock here")
def test_the_hosts_docker_socket_is_mounted_only_with_its_opt_in_and_as_resolved() -> None:
    assert judge("/var/run/docker.sock", where="m", owned=[], allow=["docker-socket"]) == "/run/docker.sock"
    with pytest.raises(BindError, match="is or holds the host's /run"):
        judge("/var/run/docker.sock", where="m", owned=[], allow=["host-path"])
    with pytest.raises(BindError, match="is or holds the host's /run"):  # the opt-in is for the socket, not its folder
        judge("/var/run", where="m", owned=[], allow=["docker-socket", "host-path"])


@pytest.mark.parametrize(("allow", "refused"), [((), True), (("host-path",), False), (("docker-socket",), True)])
def test_outside_the_owned_folders_a_path_needs_host_path(allow: tuple[str, ...], refused: bool,
                                                          tmp_path: Path) -> None:
    owned, elsewhere = tmp_path / "hf", tmp_path / "data" / "models"
    owned.mkdir()
    elsewhere.mkdir(parents=True)
    assert judge(str(owned / "."), where="m", owned=[owned], allow=allow) == str(owned)
    if refused:
        with pytest.raises(BindError, match=rf"model.path: {elsewhere} is outside the folders sparkctl owns "
                                            rf"\({owned}\); add `allow: \[host-path\]`"):
            judge(str(elsewhere), where="model.path", owned=[owned], allow=allow)
    else:
        assert judge(str(elsewhere), where="model.path", owned=[owned], allow=allow) == str(elsewhere)


def test_a_link_out_of_an_owned_folder_is_judged_where_it_leads(tmp_path: Path) -> None:
    owned, elsewhere = tmp_path / "hf", tmp_path / "home"
    elsewhere.mkdir()
    owned.mkdir()
    (owned / "escape").symlink_to(elsewhere)
    with pytest.raises(BindError, match="outside the folders sparkctl owns"):
        judge(str(owned / "escape"), where="m", owned=[owned], allow=())


@pytest.mark.parametrize(("source", "words"), [("models", "not an absolute host path"),
                                               ("/no/such/folder", "does not exist on this host")])
def test_a_path_that_is_not_a_host_folder_is_refused(source: str, words: str, tmp_path: Path) -> None:
    with pytest.raises(BindError, match=words):
        judge(source, where="m", owned=[tmp_path], allow=["host-path"])


def test_the_container_is_given_the_resolved_paths(tmp_path: Path) -> None:
    (tmp_path / "real").mkdir()
    (tmp_path / "dflash.py").write_text("# patched\n")  # an overlay: one file over the image's
    assert checked([MountPlan(str(tmp_path / "dflash.py"), "/vllm/dflash.py")], owned=[tmp_path], allow=()) == (
        MountPlan(str(tmp_path / "dflash.py"), "/vllm/dflash.py"),)
    (tmp_path / "link").symlink_to(tmp_path / "real")
    mounts = checked([MountPlan(str(tmp_path / "link"), "/model"), MountPlan(f"{tmp_path}/./real", "/x", False)],
                     owned=[tmp_path], allow=())
    assert mounts == (MountPlan(str(tmp_path / "real"), "/model"), MountPlan(str(tmp_path / "real"), "/x", False))
    with pytest.raises(BindError, match="the mount at /draft: /run is or holds"):
        checked([MountPlan(str(tmp_path), "/model"), MountPlan("/run", "/draft")], owned=[tmp_path], allow=())


def test_a_folder_it_cannot_search_is_refused(tmp_path: Path, monkeypatch) -> None:
    closed = tmp_path / "m" / "closed"
    closed.mkdir(parents=True)
    scandir = os.scandir

    def refusing(path):  # as a folder of another user's reads to a non-root sparkctl (root reads every folder)
        if str(path) == str(closed):
            raise PermissionError(13, "Permission denied", str(path))
        return scandir(path)

    monkeypatch.setattr(os, "scandir", refusing)
    with pytest.raises(BindError, match="cannot look inside .*/closed for sockets"):
        judge(str(tmp_path / "m"), where="m", owned=[tmp_path], allow=())
