"""sparkctl installed as an owner installs it: the wheel built from this tree, in a fresh venv outside
the checkout, without extras (so without Ray), its own `sparkctl` command run on a simulated stack
(`up`, `switch`, `image pin`, `image blacklist`, a stack of the owner's), then upgraded in place
(`pip install -U` of a wheel of a higher version) with the stack running, asked again, and `down`.

Slow (45 s on a loaded 2-core machine, most of it pip installing the base dependencies; each
command compiles what it imports once, as pip would have at install): it covers what no test of
the checkout can, that the wheel carries what the commands need (its package data, its base
dependencies) and that an upgrade keeps the owner's state. pip resolves through the machine's own
configuration (its index, PyPI or a mirror); its cache is SPARKCTL_BUILD_CACHE/pip when that is
set, so a second run downloads nothing. The venv and both wheels are the module's (one install for
its tests); the installed command runs with an explicit environment, never the checkout's
`PYTHONPATH`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from sparkctl.fleet import local
from sparkctl.instance import container_name
from sparkctl.node import NodeRecord
from sparkctl.state import desired
from sparkctl.state.store import Store
from tests.conftest import FAST, ROOT, stop_daemon
from tests.fakes import sandbox

STACK = "qwen36-dflash"
PINNED, PIN = "ghcr.io/owner/own-image:v1", "sha256:" + "1" * 64
BANNED = "ghcr.io/owner/broken-image:v1"
OWN_STACK = f"name: own-dflash\nextends: {STACK}\n"


@dataclass
class Installed:
    """The venv, the environment its `sparkctl` runs with, the two versions, and what the flow saw."""

    venv: Path
    env: dict[str, str]
    state: Path
    versions: tuple[str, str]
    engine_before: tuple[str, str] = ("", "")  # the stack's container: its id and when it started

    def run(self, *args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
        done = subprocess.run([str(self.venv / "bin" / "sparkctl"), *args], env=self.env, cwd=self.state.parent,
                              capture_output=True, text=True, timeout=240)
        assert not check or done.returncode == 0, f"sparkctl {' '.join(args)}: {done.stdout}{done.stderr}"
        return done

    def status(self) -> dict[str, dict]:
        return {row["stack"]: row for row in json.loads(self.run("status", "--json").stdout)}

    def engine_container(self, engine) -> tuple[str, str]:  # noqa: ANN001 - the Docker engine fixture
        found = engine.client.api.inspect_container(container_name(STACK, self.env["SPARKCTL_INSTANCE"]))
        return found["Id"], found["State"]["StartedAt"]


@pytest.fixture(scope="module")
def installed(tmp_path_factory, published, hub, engine) -> Iterator[Installed]:
    """Build both wheels, install the lower one, run the owner's flow, upgrade in place."""
    tmp = tmp_path_factory.mktemp("packaging")
    old = build_wheel(ROOT, tmp / "dist")
    version = re.match(r"sparkctl-([^-]+)-", old.name).group(1)
    new = build_wheel(bumped_tree(tmp / "tree", version, higher := higher_version(version)), tmp / "dist")
    assert new.name.startswith(f"sparkctl-{higher}-"), f"the bumped tree built {new.name}: set its version elsewhere?"
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)  # pip: the checkout's
    pip(venv, "install", str(old))
    owner = Installed(venv=venv, env=owner_environment(tmp, published.host, hub.endpoint), state=tmp / "state",
                      versions=(version, higher))
    try:
        owner_flow(owner)
        owner.engine_before = owner.engine_container(engine)
        pip(venv, "install", "-U", str(new))  # with the daemon and its engine running, as an owner upgrades
        stop_daemon(owner.state)  # as `systemctl restart sparkctl` after an upgrade: the next command starts the new
        yield owner
    finally:
        stop_daemon(owner.state)
        sandbox.remove(owner.env["SPARKCTL_INSTANCE"])


def test_an_upgrade_in_place_keeps_the_owners_state_and_its_running_stack(installed: Installed, engine) -> None:
    assert installed.run("version").stdout.startswith(f"sparkctl {installed.versions[1]} (commit ")
    row = installed.status()[STACK]  # the new daemon, started by this command, adopted the engine
    assert (row["state"], row["desired"]) == ("running", True), row
    assert installed.engine_container(engine) == installed.engine_before  # neither recreated nor restarted
    wanted = desired.load(installed.state / "desired.yaml")
    assert STACK in wanted.stacks and wanted.aliases.get("primary") == STACK
    assert Store(installed.state / "sparkctl.db").deployments.latest(STACK) is not None
    assert ask_primary(installed.env) == 200  # the agent's alias still answers through the gateway
    installed.run("stacks", "show", "own-dflash")  # the owner's stack, in the config dir, over the new shipped ones
    assert "removed 1 container" in installed.run("down", STACK).stdout


def test_pins_and_bans_survive_an_upgrade(installed: Installed) -> None:
    """Recorded in the state, not in the package's images.yaml, which an upgrade replaces (issue 48 §1)."""
    assert installed.run("image", "unpin", PINNED, check=False).returncode == 0  # refused when it is not pinned
    assert installed.run("image", "unblacklist", BANNED, check=False).returncode == 0


def test_without_ray_the_fleet_and_a_daemon_heading_one_say_what_to_install(installed: Installed) -> None:
    python = installed.venv / "bin" / "python"
    assert subprocess.run([str(python), "-c", "import ray"], capture_output=True).returncode == 1  # the base install
    advice = (f"the fleet runs on Ray, which this install of sparkctl leaves out (the `fleet` extra); add it with: "
              f"{python} -m pip install 'ray==2.60.0'")
    done = installed.run("fleet", "status", check=False)
    assert (done.returncode, done.stderr.strip()) == (1, f"error: {advice}"), done.stderr
    stop_daemon(installed.state)
    record = installed.state / "fleet" / local.RECORD_FILE
    local.write_record(record, NodeRecord(host="a", address="127.0.0.1", head="127.0.0.1:6379", is_head=True,
                                          temp_dir=str(installed.state / "fleet" / "ray"), handle={}))
    try:
        done = installed.run("status", check=False)  # starts the daemon: this Spark heads a fleet
    finally:
        record.unlink()
    assert done.returncode == 1 and len(done.stderr.strip().splitlines()) == 1, done.stderr
    assert done.stderr.startswith("error: the daemon did not start (exit code 1): ") and advice in done.stderr


# -- the owner's side -------------------------------------------------------------------------------


def owner_flow(owner: Installed) -> None:
    """What an owner does on a fresh install: a stack up and behind `primary`, an image pinned, one
    blacklisted, a stack of their own in their config dir."""
    assert owner.run("version").stdout.startswith(f"sparkctl {owner.versions[0]} (commit ")
    assert f"{STACK} up: http://127.0.0.1:" in owner.run("up", STACK).stdout
    owner.run("switch", STACK)
    assert ask_primary(owner.env) == 200
    owner.run("image", "pin", PINNED, "--digest", PIN, "--provenance", "the packaging test")
    owner.run("image", "blacklist", BANNED, "--reason", "the packaging test")
    stacks = Path(owner.env["SPARKCTL_CONFIG_DIR"]) / "stacks"
    stacks.mkdir(parents=True)
    (stacks / "own-dflash.yaml").write_text(OWN_STACK)
    owner.run("stacks", "show", "own-dflash")


def owner_environment(tmp: Path, registry: str, hub: str) -> dict[str, str]:
    """An instance of the module's own on free ports, its state and config dirs under `tmp`, images
    and weights from the loopback registry and Hub; the package's own stacks (no SPARKCTL_STACKS_DIR)."""
    (tmp / "kmsg").touch()
    (tmp / "meminfo").write_text(Path("/proc/meminfo").read_text())
    # Not the checkout's path, nor CI's PYTHONDONTWRITEBYTECODE: the venv keeps the bytecode its first imports write
    dropped = ("PYTHONPATH", "PYTHONDONTWRITEBYTECODE", "VIRTUAL_ENV", "HF_TOKEN", "SPARKCTL_HF_TOKEN")
    kept = {k: v for k, v in os.environ.items() if k not in dropped}
    return kept | sandbox.environment("pkg") | {
        "SPARKCTL_STATE_DIR": str(tmp / "state"), "SPARKCTL_CONFIG_DIR": str(tmp / "config"),
        "SPARKCTL_HF_CACHE_DIR": str(tmp / "hf"),
        "SPARKCTL_KERNEL_LOG": str(tmp / "kmsg"), "SPARKCTL_MEMINFO_PATH": str(tmp / "meminfo"),
        "SPARKCTL_REGISTRY_MIRRORS": f"ghcr.io={registry},docker.io={registry}", "SPARKCTL_HF_ENDPOINT": hub,
        "SPARKCTL_GPUS": "none", "SPARKCTL_ENGINE_ENV": FAST}


def ask_primary(env: dict[str, str]) -> int:
    body = json.dumps({"model": "primary", "messages": [{"role": "user", "content": "hi"}], "max_tokens": 4}).encode()
    request = urllib.request.Request(f"http://127.0.0.1:{env['SPARKCTL_GATEWAY_PORT']}/v1/chat/completions", body,
                                     {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=60) as answer:
        return answer.status


# -- wheels and venvs ------------------------------------------------------------------------------


def build_wheel(tree: Path, out: Path) -> Path:
    """The wheel of `tree`, as `pip wheel` builds it (its build backend in an isolated env)."""
    before = set(out.glob("*.whl"))
    pip_command = [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(tree)]
    subprocess.run(pip_command, check=True, capture_output=True, env=pip_environment())
    [wheel] = set(out.glob("*.whl")) - before
    return wheel


def bumped_tree(tree: Path, version: str, higher: str) -> Path:
    """A copy of the checkout (its sources, not its venv or caches) whose version is `higher`."""
    shutil.copytree(ROOT, tree, ignore=shutil.ignore_patterns(".venv", ".git", "__pycache__", "*cache*", "demo",
                                                              ".hypothesis", "dist", "build"))
    for path in (tree / "pyproject.toml", tree / "src" / "sparkctl" / "__init__.py"):
        path.write_text(re.sub(rf'^((?:version|__version__) = )"{re.escape(version)}"', rf'\1"{higher}"',
                               path.read_text(), count=1, flags=re.M))
    return tree


def higher_version(version: str) -> str:
    major, minor, patch = (int(part) for part in re.match(r"(\d+)\.(\d+)\.(\d+)", version).groups())
    return f"{major}.{minor}.{patch + 1}"


def pip(venv: Path, *args: str) -> None:
    """The checkout's pip, acting on `venv` (`--python`); no bytecode compiled ahead (two thirds of
    the install's time): each command compiles what it imports, once."""
    command = [sys.executable, "-m", "pip", "--python", str(venv / "bin" / "python"), *args, "-q", "--no-compile"]
    done = subprocess.run(command, capture_output=True, text=True, env=pip_environment())
    assert done.returncode == 0, done.stdout + done.stderr


def pip_environment() -> dict[str, str]:
    """The checkout's environment without its `PYTHONPATH`; pip's cache in the build cache, else none
    (nothing written outside the test's own dirs)."""
    cache = os.environ.get("SPARKCTL_BUILD_CACHE")
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return env | ({"PIP_CACHE_DIR": str(Path(cache) / "pip")} if cache else {"PIP_NO_CACHE_DIR": "1"})
