"""One drill's run: the `agent-server run` child (through the package's launcher, its JSON
log kept in a file and read once it ended), the starts, the follows, SIGTERM and the exit."""

from __future__ import annotations

import asyncio
import signal
import subprocess
import time
from dataclasses import dataclass, field

import httpx

from agent_server.process.drill.follow import START_TIMEOUT, Started, follow_one, start_all
from agent_server.process.drill.log import ChildLog
from agent_server.process.drill.plan import DrillArgs, DrillError, choose
from agent_server.process.drill.versions import NextReading, NextVersion
from agent_server.process.launcher import HOST, Launched, LaunchError, run_command
from agent_server.runtime.exits import ExitCode

#: Seconds the child may take to listen (importing an app can be slow).
STARTUP_TIMEOUT = 30.0
#: The child's exit is awaited for its grace period plus this; then it is killed.
EXIT_MARGIN = 3.0
#: After the exit, unanswered long-polls get this long to see their connection end.
POLL_SETTLE = 1.0


class Child:
    """The `agent-server run` child: started, awaited, ended; its log parsed once closed."""

    def __init__(self, args: DrillArgs) -> None:
        self.args = args
        self.log = ChildLog()
        self.launched: Launched | None = None

    def command(self) -> list[str]:
        flags: list[str] = []
        for name, value in self.args.flags.items():
            flags += [
                "--" + name.replace("_", "-"),
                f"{value:g}" if isinstance(value, float) else str(value),
            ]
        return run_command(
            self.args.app,
            "--host", HOST, "--port", "0", "--log-format", "json", "--log-level", "info",
            "--no-reload", *flags,
            port=None,
        )  # fmt: skip

    def start(self) -> None:
        self.launched = Launched(
            self.command(), env={"PYTHONUNBUFFERED": "1"}, stdin=subprocess.DEVNULL
        )

    async def port(self) -> int:
        """The port it listens on, once it does; DrillError (exit 2) when it exits 2 first,
        RuntimeError when it cannot start otherwise."""
        assert self.launched is not None
        try:
            return await self.launched.listening(STARTUP_TIMEOUT)
        except LaunchError as exc:
            if exc.code is None:
                raise RuntimeError(f"the app did not listen within {STARTUP_TIMEOUT:g} s") from None
            why = ChildLog.parse(self.launched.log_text()).last_words()
            if exc.code == ExitCode.INVALID_SETTINGS:
                raise DrillError(f"the app cannot be served (exit 2):\n{why}") from None
            raise RuntimeError(f"the app did not start (exit {exc.code}):\n{why}") from None

    def signal(self) -> None:
        assert self.launched is not None
        self.launched.signal(signal.SIGTERM)

    async def wait(self, timeout: float) -> tuple[int | None, float]:
        """Its exit code (None if it had to be killed after `timeout` seconds) and the
        seconds from the signal to its end."""
        assert self.launched is not None
        try:
            return await self.launched.exited(timeout)
        except TimeoutError:
            return None, time.monotonic() - (self.launched.signalled_at or time.monotonic())

    async def close(self) -> None:
        """End it if it still runs (the drill went wrong: SIGKILL); read its log."""
        if self.launched is not None:
            self.launched.kill()
            self.log = ChildLog.parse(self.launched.log_text())
            self.launched.close()


@dataclass
class Run:
    """What one drill observed, before it is judged."""

    app: str
    started: list[Started]
    log: ChildLog
    exit_code: int | None  # None: killed after its grace period and the margin
    shutdown_seconds: float
    signalled_at: float  # Unix time the drill sent SIGTERM
    ended_at: float  # Unix time the child had exited
    grace_period: float
    refused: dict[str, str] = field(default_factory=dict)  # reasoner -> why a start failed
    shared: bool = False  # the child's store is shared (Redis), not its memory
    #: `--next`: the next version's app, and per resumable reasoner what it makes of the
    #: work handed off (drill/versions.py).
    next_app: str | None = None
    next_versions: dict[str, NextVersion] | None = None


async def run_drill(args: DrillArgs) -> Run:
    """Start the child (and with `--next`, both apps' imports beside it), the executions and
    their long-polls; signal; wait for the exit."""
    child = Child(args)
    reading = None if args.next_app is None else NextReading(args)
    changes = None
    try:
        if reading is not None:
            await reading.start()
        child.start()
        port = await child.port()
        if reading is not None:  # before any execution: an app that cannot load is exit 2
            changes = await reading.result()
        headers = {}
        token = args.settings.bearer_token
        if token is not None:
            headers["Authorization"] = f"Bearer {token}"
        grace = args.settings.grace_period
        async with httpx.AsyncClient(
            base_url=f"http://{HOST}:{port}",
            headers=headers,
            timeout=START_TIMEOUT,
            limits=httpx.Limits(max_connections=None, max_keepalive_connections=None),
        ) as http:
            listed = await http.get("/reasoners")
            if listed.status_code != 200:
                raise RuntimeError(f"GET /reasoners answered {listed.status_code}: {listed.text}")
            plan = choose(listed.json(), args.reasoners, args.inputs)
            started, refused = await start_all(http, plan, args.executions)
            wait = min(60.0, grace + EXIT_MARGIN)
            polls = [asyncio.create_task(follow_one(http, one, wait)) for one in started]
            await asyncio.sleep(args.signal_after)
            signalled_at = time.time()
            child.signal()
            code, shutdown_seconds = await child.wait(grace + EXIT_MARGIN)
            ended_at = time.time()
            if polls:
                _, pending = await asyncio.wait(polls, timeout=POLL_SETTLE)
                for poll in pending:
                    poll.cancel()
                await asyncio.gather(*polls, return_exceptions=True)
    finally:
        if reading is not None:
            await reading.close()
        await child.close()
    agent = next(
        (str(r["agent"]) for r in child.log.records if "agent" in r and "reasoners" in r),
        args.app or "demo",
    )
    return Run(
        agent,
        started,
        child.log,
        code,
        shutdown_seconds,
        signalled_at,
        ended_at,
        grace,
        refused,
        shared=args.settings.store_url != "memory",
        next_app=args.next_app,
        next_versions=changes,
    )
