"""The state files under hostile conditions: another process holding the database's write lock,
a corrupt database, a desired.yaml that is broken or of the wrong shape, and file modes."""

from __future__ import annotations

import stat
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from sparkctl.errors import SparkctlError, SpecError, TransientError
from sparkctl.state import desired
from sparkctl.state.desired import Desired
from sparkctl.state.store import Store

HOLD = """
import sqlite3, sys, time
db = sqlite3.connect(sys.argv[1], isolation_level=None)
db.execute("BEGIN IMMEDIATE")
print("held", flush=True)
time.sleep(float(sys.argv[2]))
db.execute("ROLLBACK")
"""


def test_a_write_lock_held_elsewhere_fails_one_call_and_frees_the_store(tmp_path: Path) -> None:
    path = tmp_path / "sparkctl.db"
    store = Store(path, timeout=0.2)
    holder = subprocess.Popen([sys.executable, "-c", HOLD, str(path), "1.5"], stdout=subprocess.PIPE, text=True)
    assert holder.stdout.readline().strip() == "held"
    with pytest.raises(TransientError, match="locked by another process"):
        store.deployments.begin("qwen36-dflash")
    holder.wait(10)
    later = threading.Thread(target=store.deployments.begin, args=("qwen36-dflash",))  # as in the daemon
    later.start()
    later.join(10)  # was: it hung for good on the lock the failed call never released
    assert not later.is_alive() and store.deployments.latest("qwen36-dflash") is not None


def test_a_corrupt_database_names_its_file(tmp_path: Path) -> None:
    path = tmp_path / "sparkctl.db"
    path.write_bytes(b"this is not sqlite" * 100)
    with pytest.raises(Exception, match=f"{path}: the state database is unreadable"):
        Store(path)


@pytest.mark.parametrize(("text", "where"), [
    ("stacks: [a\naliases: {}\n", "line 2"),
    ("stacks: qwen36-dflash\n", "stacks"),  # was read as 13 one-letter stacks
    ("stacks: [a, {b: 1}]\n", "stacks"),
    ("aliases: [primary]\n", "aliases"),
    ("fallbacks: {primary: [a]}\n", "fallbacks"),
    ("routes: {primary: [{stack: a, up_to: 10}, {stack: b, upto: 3}]}\n", "routes.primary"),
    ("routes: {primary: [{stack: a, up_to: ten}, {stack: b}]}\n", "routes.primary"),
    ("routes: {primary: [{stack: a, up_to: 10}, {stack: b, up_to: 20}]}\n", "routes.primary: routed alias"),
    ("routes: [a]\n", "routes"),
    ("aliases: {primary: a}\nroutes: {primary: [{stack: a, up_to: 10}, {stack: b}]}\n", "routes.primary: an alias"),
])
def test_a_broken_desired_file_names_file_and_place(tmp_path: Path, text: str, where: str) -> None:
    path = tmp_path / "desired.yaml"
    path.write_text(text)
    with pytest.raises(SpecError) as caught:
        desired.load(path)
    assert caught.value.file == str(path) and where in str(caught.value)


def test_state_files_are_private(tmp_path: Path) -> None:
    desired.save(tmp_path / "desired.yaml", Desired(("a",)))
    (tmp_path / "old.db").write_bytes(b"")
    (tmp_path / "old.db").chmod(0o644)
    Store(tmp_path / "old.db")
    Store(tmp_path / "new.db")
    for name in ("desired.yaml", "old.db", "new.db"):
        assert stat.S_IMODE((tmp_path / name).stat().st_mode) == 0o600, name


def test_a_failing_commit_is_rolled_back_and_the_store_stays_usable(tmp_path: Path) -> None:
    """A COMMIT that fails (here a deferred foreign key, as a full disk or a constraint would)
    left its transaction open on the store's one connection: the half-written rows stayed
    visible to the daemon's reads, and every later write failed as "locked by another process"."""
    path = tmp_path / "sparkctl.db"
    store = Store(path)
    with pytest.raises(SparkctlError, match=f"{path}: the state database could not commit .*FOREIGN KEY.*nothing "
                                            "of it was kept"), store.db.tx() as db:
        db.execute("PRAGMA defer_foreign_keys = ON")
        db.execute("INSERT INTO events (at, stack, kind) VALUES (1, 'half', 'written')")
        db.execute("INSERT INTO transitions (deployment, phase, at) VALUES (404, 'running', 1)")
    assert not store.db.db.in_transaction
    assert store.db.all("SELECT * FROM events") == [] and store.db.all("SELECT * FROM transitions") == []
    deployment = store.deployments.begin("qwen36-dflash")  # the next write goes through
    assert store.deployments.latest("qwen36-dflash").id == deployment
    assert Store(path).deployments.latest("qwen36-dflash").id == deployment  # and is committed
