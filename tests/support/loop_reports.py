"""What asyncio reports about lost tasks (an exception never retrieved, a task destroyed while
pending), collected over a block of a test, with garbage collected at its end so a lost task is
reported at all."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
from collections.abc import AsyncIterator

UNOBSERVED = ("Task exception was never retrieved", "Task was destroyed but it is pending")


async def settle_loop() -> None:
    """Collect garbage and let the loop run callbacks, so a lost task would be reported."""
    for _ in range(2):
        gc.collect()
        await asyncio.sleep(0)
        await asyncio.sleep(0.005)


class LoopReports(logging.Handler):
    """What asyncio reports about lost tasks, from whichever test phase it comes.

    (caplog keeps one record list per phase: a teardown check would miss the call phase.)
    """

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(record.getMessage())

    def unobserved(self) -> list[str]:
        return [line for line in self.lines if any(m in line for m in UNOBSERVED)]


@contextlib.asynccontextmanager
async def loop_reports() -> AsyncIterator[LoopReports]:
    """Collect asyncio's reports; at the end, collect garbage so a lost task is reported.

    Objects older than the block are frozen, so the collections scan only what it created.
    """
    reports = LoopReports()
    asyncio_logger = logging.getLogger("asyncio")
    asyncio_logger.addHandler(reports)
    gc.freeze()
    try:
        yield reports
        await settle_loop()
    finally:
        gc.unfreeze()
        asyncio_logger.removeHandler(reports)
