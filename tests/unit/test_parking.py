"""Parking's pure parts: what each state holds and peaks at, the watchdog on a scripted
MemAvailable, and the planner leaving parked stacks alone."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

from sparkctl.daemon.sleeper import MemoryWatch
from sparkctl.deploy.memory import folder_bytes, meminfo
from sparkctl.policy.parking import Footprint, Park, choose


def test_each_state_holds_and_peaks_as_on_unified_memory() -> None:
    qwen = Footprint(awake=0.8, weights=0.2, residue=0.02)
    assert [qwen.held(level) for level in (0, 1, 2)] == [0.8, pytest.approx(0.22), 0.02]
    assert [qwen.peak(level) for level in (0, 1, 2)] == [0.8, 1.0, 0.8]  # level 1 copies the weights once more


def test_auto_takes_level_1_then_2_then_stop_as_room_shrinks() -> None:
    stack = Footprint(0.4, 0.2, 0.02)
    picks = [choose(Park.AUTO, stack, beside=beside, after=after, ceiling=0.9).park
             for beside, after in ((0.2, 0.2), (0.4, 0.4), (0.4, 0.89))]
    assert picks == [Park.SLEEP1, Park.SLEEP2, Park.STOP]
    assert "over the ceiling" in choose(Park.AUTO, stack, beside=0.4, after=0.89, ceiling=0.9).why


def test_the_watchdog_trips_once_the_moment_memory_falls_under_the_floor() -> None:
    readings = iter([9, 8, 7, 3, 2, 1])
    kills: list[int] = []
    done = threading.Event()
    watch = MemoryWatch(4, lambda available: (kills.append(available), done.set()), every=0.001,
                        available=lambda: next(readings, 1))
    with watch:
        assert done.wait(5)
    assert kills == [3] and watch.tripped == 3 and watch.lowest == 3


def test_a_quiet_wake_never_trips() -> None:
    with MemoryWatch(4, lambda _: pytest.fail("tripped"), every=0.001, available=lambda: 10) as watch:
        pass
    assert watch.tripped is None and watch.lowest == 10


def test_meminfo_reads_bytes(tmp_path: Path) -> None:
    (tmp_path / "meminfo").write_text("MemTotal:       24576000 kB\nMemAvailable:    1024 kB\n")
    assert meminfo("MemAvailable", tmp_path / "meminfo") == 1024 * 1024
    with pytest.raises(KeyError):
        meminfo("SwapTotal", tmp_path / "meminfo")
    assert meminfo("MemTotal") > 0  # this machine's


def test_weights_are_measured_through_the_hf_cache_links(tmp_path: Path) -> None:
    (tmp_path / "blobs").mkdir()
    (tmp_path / "blobs" / "abc").write_bytes(b"x" * 1000)
    (tmp_path / "snap").mkdir()
    (tmp_path / "snap" / "model.safetensors").symlink_to(tmp_path / "blobs" / "abc")
    assert folder_bytes(tmp_path / "snap") == 1000
