"""Runner: a uvicorn.Server whose signals start the shutdown sequence, not an exit.

Read top to bottom: startup (uvicorn's), main loop (serve until the first signal, then run
the shutdown phases while the listener is still open), then close the listener and let
uvicorn finish open responses within the http timeout. The exit code is the report's.
"""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import socket
import time
from types import FrameType

import uvicorn

from agent_server.agent import Agent, end_process
from agent_server.logs import format_line
from agent_server.shutdown import ExitCode, Watchdog

logger = logging.getLogger("agent_server.runner")

#: After the listening socket closes, requests already accepted on open connections are
#: still read and answered (503 + Connection: close) for this long, so none is reset.
LISTENER_LINGER = 0.1


class Runner(uvicorn.Server):
    """Serves one Agent; the first SIGTERM/SIGINT drains, the second cancels, the third exits."""

    def __init__(self, config: uvicorn.Config, agent: Agent) -> None:
        super().__init__(config)
        self.agent = agent
        self.exit_code: int = ExitCode.OK
        self.signals = 0
        self._loop: asyncio.AbstractEventLoop | None = None
        self._requested: asyncio.Event | None = None
        self.watchdog = Watchdog(self._watchdog_line)

    # -- signals (main thread, between bytecodes: set flags and hand over to the loop) -----

    def handle_exit(self, sig: int, frame: FrameType | None) -> None:
        self.signals += 1
        now = time.monotonic()
        if self.signals == 1:
            self.watchdog.arm(self.agent.shutdown.plan.watchdog_after, now)
            if self._loop is None:  # before startup: nothing to drain yet
                self.should_exit = True
                return
            self._loop.call_soon_threadsafe(self._begin, now, time.time(), sig)
        elif self.signals == 2:
            if self._loop is not None:
                self._loop.call_soon_threadsafe(self.agent.shutdown.skip_to_cancel)
        else:
            os.write(2, b"agent-server: third signal, exiting now (exit code 5)\n")
            os._exit(ExitCode.FORCED)

    def _begin(self, started: float, wall_time: float, sig: int) -> None:
        self.agent.shutdown.begin(started, wall_time, signal.Signals(sig).name)
        assert self._requested is not None
        self._requested.set()

    # -- lifecycle ---------------------------------------------------------------------------

    async def serve(self, sockets: list[socket.socket] | None = None) -> None:
        await super().serve(sockets)
        if self.agent.registry.abandoned_pending:
            end_process(self.exit_code)

    async def startup(self, sockets: list[socket.socket] | None = None) -> None:
        self._loop = asyncio.get_running_loop()
        self._requested = asyncio.Event()
        await super().startup(sockets)

    async def main_loop(self) -> None:
        """Serve until the first signal, then run the shutdown with the listener open."""
        assert self._requested is not None
        ticker = asyncio.create_task(super().main_loop())
        requested = asyncio.create_task(self._requested.wait())
        try:
            await asyncio.wait({ticker, requested}, return_when=asyncio.FIRST_COMPLETED)
            if self._requested.is_set():
                report = await self.agent.shutdown.run()
                self.exit_code = report.exit_code
                await self._close_listener()
        finally:
            self.should_exit = True
            requested.cancel()
            await asyncio.gather(ticker, requested, return_exceptions=True)

    async def _close_listener(self) -> None:
        """Stop accepting connections, then let already-accepted requests be answered."""
        for server in self.servers:
            server.close()
        await asyncio.sleep(LISTENER_LINGER)

    def _watchdog_line(self, elapsed: float) -> str:
        message = (
            f"watchdog fired {elapsed:.2f}s after the first signal (grace period "
            f"{self.agent.shutdown.plan.grace_period:g}s): exiting with code "
            f"{int(ExitCode.WATCHDOG)}"
        )
        return format_line(self.agent.settings.log_format, "critical", logger.name, message)
