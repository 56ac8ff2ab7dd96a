"""What the gateway's HTTP tests share: a transport that records, and bytes cut into pieces."""

from __future__ import annotations

import itertools


class Transport:
    """Records what a protocol writes, and whether it closed or paused reading."""

    def __init__(self) -> None:
        self.written, self.closed, self.reading = b"", False, True

    def write(self, data: bytes) -> None:
        self.written += data

    def close(self) -> None:
        self.closed = True

    def abort(self) -> None:
        self.closed = True

    def get_write_buffer_size(self) -> int:
        return 0  # all written at once

    def get_extra_info(self, name: str) -> None:
        return None

    def is_reading(self) -> bool:
        return self.reading

    def pause_reading(self) -> None:
        self.reading = False

    def resume_reading(self) -> None:
        self.reading = True


def split(data: bytes, cuts: list[int]) -> list[bytes]:
    """`data` cut at the given offsets (taken modulo its length), as a socket might deliver it."""
    points = sorted({c % (len(data) + 1) for c in cuts} | {0, len(data)})
    return [data[a:b] for a, b in itertools.pairwise(points)]
