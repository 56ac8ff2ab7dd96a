"""The sentinel's pure judgements (policy/wedge.py), its last-words file (state/lastwords.py)
and the doctor's GB10 parsing (doctor/gb10.py), table-driven."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sparkctl.doctor.gb10 import remove_ipc
from sparkctl.policy import wedge
from sparkctl.policy.wedge import GIB, Progress, Sign
from sparkctl.state import lastwords
from sparkctl.state.lastwords import LastWords

NVRM = "NVRM: _memdescAllocInternal: nvAssertFailedNoLog: Assertion failed: NV_ERR_NO_MEMORY"


@pytest.mark.parametrize(("line", "sign"), [
    (f"3,1234,5678901,-;{NVRM}", Sign.NVRM_OOM),  # a /dev/kmsg record
    (NVRM, Sign.NVRM_OOM),  # journalctl -k -o cat
    ("4,99,1,-;NVRM: Xid (PCI:0000:01:00): 43, pid=1234, name=python3, Ch 00000008", Sign.XID),
    ("6,100,2,-;NVRM: loading NVIDIA UNIX Open Kernel Module for aarch64  580.95.05", None),
    ("6,101,3,-;usb 1-1: new high-speed USB device", None),
])
def test_kernel_lines(line: str, sign: Sign | None) -> None:
    warning = wedge.kernel_line(line)
    assert (warning and warning.sign) == sign
    if warning:
        assert not warning.detail.startswith(("3,", "4,"))  # the record prefix is not the line


def test_only_an_xid_alone_does_not_act() -> None:
    assert [s for s in Sign if not s.acts] == [Sign.XID]


@pytest.mark.parametrize(("samples", "sign"), [
    ([(0, 20 * GIB)], None),
    ([(0, 3 * GIB)], Sign.MEMORY_LOW),
    ([(0, 20 * GIB), (1, 16 * GIB), (2, 12 * GIB)], Sign.MEMORY_FALLING),  # 4 GiB/s: under 4 GiB within 5 s
    ([(0, 20 * GIB), (1, 19.5 * GIB), (2, 19 * GIB)], None),  # 0.5 GiB/s: far from the floor
    ([(0, 10 * GIB), (1, 12 * GIB)], None),  # rising
])
def test_memory_signs(samples: list[tuple[float, float]], sign: Sign | None) -> None:
    warning = wedge.memory([(t, int(b)) for t, b in samples], floor=4 * GIB)
    assert (warning and warning.sign) == sign


def test_the_engine_that_grew_last_is_the_newest() -> None:
    assert wedge.grew_last({"a": 100.0, "b": 250.0, "c": 200.0}) == "b"
    assert wedge.grew_last({}) is None


def counters(generated: float, prompt: float, running: float) -> dict[str, float]:
    return {wedge.GENERATED: generated, wedge.PROMPT: prompt, wedge.RUNNING: running}


def test_flat_counters_with_requests_running_are_a_hang_past_the_bound() -> None:
    p = wedge.progress(None, counters(10, 100, 1), now=0.0)
    p = wedge.progress(p, counters(12, 100, 1), now=1.0)  # generating
    assert p.moved == 1.0
    for t in (2.0, 5.0, 11.0):
        p = wedge.progress(p, counters(12, 100, 1), now=t)
    assert not wedge.hung(p, 10.0, bound=10) and wedge.hung(p, 11.5, bound=10)


@pytest.mark.parametrize(("later", "moved"), [
    (counters(12, 8292, 1), 20.0),  # a long prefill moves prompt tokens: not a hang
    (counters(0, 0, 0), 20.0),  # restarted: counters went back
    (counters(12, 100, 0), 1.0),  # nothing runs: idle, never hung
])
def test_what_is_not_a_hang(later: dict[str, float], moved: float) -> None:
    p = wedge.progress(Progress(12, 100, 1, 1.0), later, now=20.0)
    assert p.moved == moved and not wedge.hung(p, 20.0, bound=10)


def test_last_words_survive_and_rotate(tmp_path: Path) -> None:
    words = LastWords(tmp_path, limit=400)
    for i in range(30):
        words.append({"at": 1000.0 + i, "available_gib": 20.0 - i / 10, "engines": {"a": "serving"},
                      "kernel": [NVRM] if i > 25 else []})
    assert (tmp_path / lastwords.FILE).stat().st_size <= 400 and (tmp_path / lastwords.OLDER).exists()
    # killed here: no `stopped` record; no daemon runs
    ending = lastwords.previous(tmp_path, daemon_running=False)
    assert ending is not None and ending.last["at"] == 1029.0
    assert "NV_ERR_NO_MEMORY" in ending.summary() and "a serving" in ending.summary()
    # the next daemon keeps it as the previous run, and starts afresh
    kept = LastWords(tmp_path).begin()
    assert kept is not None and kept.last["at"] == 1029.0 and not (tmp_path / lastwords.FILE).exists()
    assert lastwords.previous(tmp_path, daemon_running=True).last["at"] == 1029.0


def test_a_clean_stop_leaves_no_last_words(tmp_path: Path) -> None:
    words = LastWords(tmp_path)
    words.append({"at": 1.0, "available_gib": 20.0})
    words.stopped()
    assert lastwords.previous(tmp_path, daemon_running=False) is None
    assert LastWords(tmp_path).begin() is None


def test_a_line_cut_by_the_freeze_is_skipped(tmp_path: Path) -> None:
    (tmp_path / lastwords.FILE).write_text(json.dumps({"at": 5.0, "available_gib": 1.0}) + '\n{"at": 6.0, "avai')
    ending = lastwords.previous(tmp_path, daemon_running=False)
    assert ending is not None and ending.last["at"] == 5.0


@pytest.mark.parametrize(("files", "removes", "where"), [
    ([], True, "systemd's default (unset)"),
    ([("logind.conf", "[Login]\n#RemoveIPC=yes\n")], True, "systemd's default (unset)"),
    ([("logind.conf", "[Login]\nRemoveIPC=no\n")], False, "logind.conf"),
    ([("logind.conf", "[Login]\nRemoveIPC=no\n"), ("10-x.conf", "[Login]\nRemoveIPC=yes\n")], True, "10-x.conf"),
    ([("logind.conf", "[Other]\nRemoveIPC=no\n")], True, "systemd's default (unset)"),
])
def test_logind_remove_ipc(files: list[tuple[str, str]], removes: bool, where: str) -> None:
    assert remove_ipc([(Path(name), text) for name, text in files]) == (removes, where)


def test_a_written_record_is_on_disk(tmp_path: Path) -> None:
    """The writer fsyncs each record: what it wrote is in the file before the next one."""
    words = LastWords(tmp_path)
    words.append({"at": 1.0})
    assert os.path.getsize(tmp_path / lastwords.FILE) > 0


def test_a_kernel_log_file_is_read_from_its_end_and_a_pipe_that_ends_says_so(tmp_path: Path) -> None:
    from sparkctl.adapters.kernellog import open_log, probe

    file = tmp_path / "kmsg"
    file.write_text("old line, before the daemon\n")
    log = open_log(str(file))
    assert not isinstance(log, str) and not log.pollable
    with file.open("a") as f:
        f.write(f"{NVRM}\nhalf a li")
    assert log.read() == [NVRM] and not log.ended  # a regular file at its end is not over
    log.close()
    fifo = tmp_path / "fifo"
    os.mkfifo(fifo)
    keep = os.open(fifo, os.O_RDONLY | os.O_NONBLOCK)  # so the writer can open
    writer = os.open(fifo, os.O_WRONLY)
    piped = open_log(str(fifo))
    assert not isinstance(piped, str) and piped.pollable
    os.write(writer, f"{NVRM}\n".encode())
    assert piped.read() == [NVRM]
    os.close(writer)
    assert piped.read() == [] and piped.ended
    piped.close()
    os.close(keep)
    assert probe(str(tmp_path / "missing"))[0] is None
