"""Event-loop lag: how late the loop turns, and who held it when it stalled.

A reasoner that blocks inside `async def` (`time.sleep`, a synchronous HTTP client, a long
computation) holds every other request, probe and long-poll of the process. Two parts watch
for it, both cheap enough to run always:

- `LoopLagSampler`'s task wakes every `INTERVAL` seconds on the loop and observes how late it
  woke (the histogram `agent_server_event_loop_lag_seconds`).
- Its daemon thread notices when the loop has not turned for `STALL_THRESHOLD` seconds (the
  task is that late) and reads the loop thread's stack with `sys._current_frames()`: the
  innermost frame outside asyncio, selectors, uvloop and agent-server is the code that holds
  the loop, and the reasoner whose coroutine is on the stack is named beside it. One WARNING
  per stall, logged while the loop is still blocked, so a stall that ends in the watchdog is
  named too; the task logs how long it lasted once the loop turns again.

The sampler is started by the agent's lifespan and stopped at its end, after the shutdown
report: stalls during the drain are seen.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import importlib.util
import logging
import os
import selectors
import sys
import threading
import time
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import CodeType, FrameType

from agent_server.model.counts import counted
from agent_server.runtime.signals import block_in_this_thread

logger = logging.getLogger("agent_server.loop_lag")

#: Seconds between the sampler's wake-ups: 4 a second.
INTERVAL = 0.25
#: A loop late by more than this has stalled: one WARNING names what held it.
STALL_THRESHOLD = 1.0
#: How often the watching thread looks at the loop's last turn.
CHECK_EVERY = 0.2
#: The longest lags kept for the line logged when the sampler stops (`agent-server drill`
#: reads it to tell which reasoners ran while the loop was late).
KEPT_LAGS = 10
#: Bound on the watching thread's exit at stop.
JOIN_TIMEOUT = 1.0


def _directory(path: str | None) -> str | None:
    return None if path is None else os.path.dirname(os.path.abspath(path)) + os.sep


def _uvloop_directory() -> str | None:
    """Without importing uvloop (the server may run on asyncio's own loop)."""
    try:
        spec = importlib.util.find_spec("uvloop")
    except (ImportError, ValueError):
        return None
    return None if spec is None else _directory(spec.origin)


#: Code in these places runs the loop, it does not hold it: never named as the culprit.
FRAMEWORK_PLACES: tuple[str, ...] = tuple(
    place
    for place in (
        _directory(asyncio.__file__),
        os.path.abspath(selectors.__file__),
        _uvloop_directory(),
        _directory(os.path.dirname(os.path.abspath(__file__))),  # agent_server/
    )
    if place is not None
)


@dataclass(frozen=True)
class Culprit:
    """What held the loop: the innermost frame of the user's code, and the reasoner (if
    any) whose coroutine was on the stack."""

    function: str
    file: str
    line: int
    reasoner: str | None = None

    @property
    def where(self) -> str:
        """`function at file:line`, the file relative to the working directory when under it."""
        return f"{self.function} at {_shown_path(self.file)}:{self.line}"

    def fields(self) -> dict[str, object]:
        return {
            "function": self.function,
            "file": self.file,
            "line": self.line,
            "reasoner": self.reasoner,
        }


def _shown_path(path: str) -> str:
    try:
        relative = os.path.relpath(path)
    except ValueError:
        return path
    return path if relative.startswith("..") else relative


def name_culprit(
    frame: FrameType | None,
    reasoners: Mapping[CodeType, str],
    framework: tuple[str, ...] = FRAMEWORK_PLACES,
) -> Culprit | None:
    """The innermost frame not in `framework`, and the innermost reasoner on the stack.

    When every frame is the framework's (a pause of the interpreter itself, say), the
    innermost reasoner frame is named, else the innermost frame: something is always said.
    """
    innermost: FrameType | None = None
    chosen: FrameType | None = None
    reasoner_frame: FrameType | None = None
    reasoner: str | None = None
    while frame is not None:
        code = frame.f_code
        if innermost is None:
            innermost = frame
        if chosen is None and not code.co_filename.startswith(framework):
            chosen = frame
        if reasoner is None and code in reasoners:
            reasoner, reasoner_frame = reasoners[code], frame
        frame = frame.f_back
    chosen = chosen or reasoner_frame or innermost
    if chosen is None:
        return None
    code = chosen.f_code
    return Culprit(code.co_name, code.co_filename, chosen.f_lineno, reasoner)


def reasoner_codes(functions: Iterable[tuple[str, Callable[..., object]]]) -> dict[CodeType, str]:
    """The code object of each reasoner's function (decorators unwrapped), by name."""
    import inspect

    found: dict[CodeType, str] = {}
    for name, func in functions:
        code = getattr(inspect.unwrap(func), "__code__", None)
        if isinstance(code, CodeType):
            found[code] = name
    return found


class LoopLagSampler:
    """The lag sampler (a task on the loop) and the stall watch (a daemon thread)."""

    def __init__(
        self,
        observe: Callable[[float], None],
        reasoners: Mapping[CodeType, str] | None = None,
        *,
        interval: float = INTERVAL,
        threshold: float = STALL_THRESHOLD,
    ) -> None:
        """`observe` records each lag (the histogram); `reasoners` names their code."""
        self._observe = observe
        self._reasoners: Mapping[CodeType, str] = reasoners or {}
        self.interval = interval
        self.threshold = threshold
        #: When the sampler should next wake (monotonic); written by the loop thread only.
        self._due = 0.0
        #: The `_due` of the stall last reported, so one stall is reported once.
        self._reported_due = -1.0
        self._claiming = threading.Lock()
        self._culprit: Culprit | None = None
        self._loop_thread = 0
        self._task: asyncio.Task[None] | None = None
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self.samples = 0
        self.stalls = 0
        self.longest = 0.0
        #: The `KEPT_LAGS` longest lags as (seconds, Unix time the loop turned again).
        self._kept: list[tuple[float, float]] = []

    def start(self) -> None:
        """On the loop's thread (the lifespan): the task first, then the thread."""
        self._loop_thread = threading.get_ident()
        self._due = time.monotonic() + self.interval
        self._task = asyncio.get_running_loop().create_task(self._sample(), name="loop-lag")
        self._thread = threading.Thread(target=self._watch, name="loop-stall-watch", daemon=True)
        self._thread.start()

    async def stop(self) -> None:
        """End both, bounded; log the longest lags seen (one line)."""
        self._stop.set()
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
            self._task = None
        if self._thread is not None:
            self._thread.join(JOIN_TIMEOUT)
            self._thread = None
        kept = sorted(self._kept, key=lambda lag: lag[1])
        logger.info(
            "event loop lag: longest %.3fs over %s; stalls over %gs: %d",
            self.longest,
            counted(self.samples, "sample"),
            self.threshold,
            self.stalls,
            extra={
                "fields": {
                    "longest_lag_seconds": round(self.longest, 4),
                    "samples": self.samples,
                    "stalls": self.stalls,
                    "longest_lags": [[round(s, 4), round(at, 4)] for s, at in kept],
                }
            },
        )

    async def _sample(self) -> None:
        interval = self.interval
        while True:
            due = time.monotonic() + interval
            self._due = due
            await asyncio.sleep(interval)
            lag = max(0.0, time.monotonic() - due)
            self._lagged(lag, due)

    def _claim(self, due: float) -> bool:
        """Whether the stall of the sleep due at `due` is still to be reported: the thread
        and the task may both see it; one reports it."""
        with self._claiming:
            if self._reported_due == due:
                return False
            self._reported_due = due
            return True

    def _lagged(self, lag: float, due: float) -> None:
        """One sample, on the loop: the histogram, the longest kept, a stall's end."""
        self.samples += 1
        self._observe(lag)
        kept = self._kept
        if len(kept) < KEPT_LAGS:
            heapq.heappush(kept, (lag, time.time()))
        elif lag > kept[0][0]:
            heapq.heapreplace(kept, (lag, time.time()))
        if lag > self.longest:
            self.longest = lag
        if lag > self.threshold:
            self.stalls += 1
            if self._claim(due):  # over before the thread looked: the stack is gone
                logger.warning(
                    "event loop blocked for %.2fs by unknown code (the stall ended before "
                    "the watch could read the stack)",
                    lag,
                    extra={"fields": {"blocked_seconds": round(lag, 4)}},
                )
            culprit = self._culprit
            self._culprit = None
            held = "" if culprit is None else f" (held by {_described(culprit)})"
            logger.info(
                "event loop stall ended after %.2fs%s",
                lag,
                held,
                extra={
                    "fields": {
                        "stall_seconds": round(lag, 4),
                        **({} if culprit is None else culprit.fields()),
                    }
                },
            )

    def _watch(self) -> None:
        """The daemon thread: name what holds the loop once per stall. An error here is
        logged and ends the watch; the sampler's task goes on."""
        block_in_this_thread()
        try:
            while not self._stop.wait(CHECK_EVERY):
                self._check(time.monotonic())
        except Exception:
            logger.exception("the event loop's stall watch failed; stalls are no longer named")

    def _check(self, now: float) -> None:
        due = self._due
        late = now - due
        if late <= self.threshold or not self._claim(due):
            return
        frame = sys._current_frames().get(self._loop_thread)
        culprit = name_culprit(frame, self._reasoners)
        del frame
        self._culprit = culprit
        what = "unknown code" if culprit is None else _described(culprit)
        logger.warning(
            "event loop blocked for %.2fs so far by %s",
            late,
            what,
            extra={
                "fields": {
                    "blocked_seconds": round(late, 4),
                    **({} if culprit is None else culprit.fields()),
                }
            },
        )


def _described(culprit: Culprit) -> str:
    if culprit.reasoner is None:
        return culprit.where
    return f"reasoner {culprit.reasoner!r} in {culprit.where}"
