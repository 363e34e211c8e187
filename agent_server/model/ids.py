"""The execution id pool: UUID 4 hex from `os.urandom`, discarded in a forked child."""

from __future__ import annotations

import os


class RandomIds:
    """Random UUID 4s as 32 hex digits: unguessable and unique across restarts.

    The same values as `uuid.uuid4().hex`, from `os.urandom` read 4 KiB at a time: one system
    call per 256 ids instead of one per id (bench/RESULTS.md).
    """

    __slots__ = ("_next", "_pool")

    POOL_BYTES = 4096

    def __init__(self) -> None:
        self._pool = bytearray()
        self._next = 0

    def new(self) -> str:
        start = self._next
        if start + 16 > len(self._pool):
            self._pool = bytearray(os.urandom(self.POOL_BYTES))
            start = 0
        self._next = start + 16
        raw = self._pool[start : start + 16]
        raw[6] = raw[6] & 0x0F | 0x40  # version 4
        raw[8] = raw[8] & 0x3F | 0x80  # RFC 4122 variant
        return raw.hex()

    def discard(self) -> None:
        """Forget the pooled bytes: a forked child must not hand out its parent's ids."""
        self._pool = bytearray()
        self._next = 0


#: One pool per process, like the operating system's random source it draws on.
_ids = RandomIds()
os.register_at_fork(after_in_child=_ids.discard)


def new_execution_id() -> str:
    return _ids.new()
