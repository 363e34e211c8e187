"""The loop-lag sampler's naming of what held the loop, on fake stacks and on a real one, and
its one report per stall."""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from dataclasses import dataclass
from types import CodeType

import pytest

from agent_server.runtime.loop_lag import (
    FRAMEWORK_PLACES,
    LoopLagSampler,
    name_culprit,
    reasoner_codes,
)


@dataclass(frozen=True)
class FakeCode:
    co_name: str
    co_filename: str


@dataclass
class FakeFrame:
    f_code: FakeCode
    f_lineno: int
    f_back: FakeFrame | None


def stack(*frames: tuple[str, str, int]) -> FakeFrame:
    """Frames given outermost first, as a traceback reads; the innermost is returned."""
    frame: FakeFrame | None = None
    for name, path, line in frames:
        frame = FakeFrame(FakeCode(name, path), line, frame)
    assert frame is not None
    return frame


FRAMEWORK = (
    "/usr/lib/python3.11/asyncio/",
    "/usr/lib/python3.11/selectors.py",
    "/srv/agent_server/",
)


def test_the_innermost_frame_outside_the_framework_is_named() -> None:
    top = stack(
        ("run", "/usr/lib/python3.11/asyncio/runners.py", 118),
        ("_run_once", "/usr/lib/python3.11/asyncio/base_events.py", 1922),
        ("_run", "/srv/agent_server/runtime/registry.py", 420),
        ("answer", "/app/bot.py", 30),
        ("fetch", "/app/helpers.py", 12),
    )
    answer = top.f_back
    assert answer is not None
    culprit = name_culprit(top, {answer.f_code: "answer"}, FRAMEWORK)  # type: ignore[arg-type,dict-item]
    assert culprit is not None
    assert (culprit.function, culprit.file, culprit.line) == ("fetch", "/app/helpers.py", 12)
    assert culprit.reasoner == "answer"
    assert culprit.where == "fetch at /app/helpers.py:12"


def test_framework_frames_inside_the_users_code_are_skipped() -> None:
    top = stack(
        ("_run_once", "/usr/lib/python3.11/asyncio/base_events.py", 1922),
        ("answer", "/app/bot.py", 30),
        ("emit", "/srv/agent_server/model/execution.py", 300),  # called by the reasoner
        ("select", "/usr/lib/python3.11/selectors.py", 468),
    )
    culprit = name_culprit(top, {}, FRAMEWORK)  # type: ignore[arg-type]
    assert culprit is not None
    assert (culprit.function, culprit.line, culprit.reasoner) == ("answer", 30, None)


def test_a_stack_of_framework_frames_only_names_its_innermost() -> None:
    top = stack(
        ("run", "/usr/lib/python3.11/asyncio/runners.py", 118),
        ("select", "/usr/lib/python3.11/selectors.py", 468),
    )
    culprit = name_culprit(top, {}, FRAMEWORK)  # type: ignore[arg-type]
    assert culprit is not None and culprit.function == "select"
    assert name_culprit(None, {}, FRAMEWORK) is None


def test_the_real_framework_places_cover_asyncio_and_agent_server() -> None:
    assert any(place.endswith("asyncio/") for place in FRAMEWORK_PLACES)
    assert any(place.endswith("agent_server/") for place in FRAMEWORK_PLACES)


def _blocking_helper(seconds: float) -> None:
    time.sleep(seconds)


async def _blocking_reasoner(seconds: float) -> None:
    _blocking_helper(seconds)


def test_reasoner_codes_unwrap_decorators() -> None:
    import functools

    @functools.wraps(_blocking_reasoner)
    async def wrapped(seconds: float) -> None:
        await _blocking_reasoner(seconds)

    codes = reasoner_codes([("blocks", wrapped)])
    assert codes == {_blocking_reasoner.__code__: "blocks"}
    assert isinstance(next(iter(codes)), CodeType)


async def test_a_stall_is_reported_once_naming_the_helper_and_the_reasoner(
    caplog: pytest.LogCaptureFixture,
) -> None:
    lags: list[float] = []
    sampler = LoopLagSampler(
        lags.append,
        reasoner_codes([("blocks", _blocking_reasoner)]),
        interval=0.05,
        threshold=0.3,
    )
    caplog.set_level(logging.INFO, logger="agent_server.loop_lag")
    sampler.start()
    try:
        await asyncio.sleep(0.12)  # a few ordinary samples first
        await _blocking_reasoner(1.0)  # the thread looks every 0.2 s: it sees it more than once
        await asyncio.sleep(0.12)
    finally:
        await sampler.stop()
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1, [r.getMessage() for r in warnings]
    fields = warnings[0].fields  # type: ignore[attr-defined]
    assert fields["function"] == "_blocking_helper"
    assert fields["reasoner"] == "blocks"
    assert fields["file"] == __file__
    assert "reasoner 'blocks' in _blocking_helper at" in warnings[0].getMessage()
    ended = [r for r in caplog.records if "stall ended" in r.getMessage()]
    assert len(ended) == 1 and ended[0].fields["stall_seconds"] > 0.9  # type: ignore[attr-defined]
    assert max(lags) > 0.9 and sampler.stalls == 1
    summary = caplog.records[-1].fields  # type: ignore[attr-defined]
    assert summary["stalls"] == 1 and summary["samples"] == len(lags)
    assert max(seconds for seconds, _ in summary["longest_lags"]) > 0.9


async def test_the_watch_thread_ends_at_stop() -> None:
    sampler = LoopLagSampler(lambda lag: None)
    sampler.start()
    await asyncio.sleep(0)
    assert "loop-stall-watch" in {t.name for t in threading.enumerate()}
    await sampler.stop()
    assert "loop-stall-watch" not in {t.name for t in threading.enumerate()}


async def test_one_sample_is_one_sample_in_the_summary(caplog: pytest.LogCaptureFixture) -> None:
    """A server that lives less than two intervals (a bind that fails, a quick drill) took one
    sample: the summary said "over 1 samples"."""
    sampler = LoopLagSampler(lambda lag: None, interval=0.5)  # half a second to stop in
    caplog.set_level(logging.INFO, logger="agent_server.loop_lag")
    sampler.start()
    try:
        deadline = time.monotonic() + 5.0
        while sampler.samples == 0:  # the first wake-up, then stop before the second
            assert time.monotonic() < deadline, "no sample within 5 s"
            await asyncio.sleep(0.005)
    finally:
        await sampler.stop()
    summary = caplog.records[-1]
    assert summary.fields["samples"] == 1  # type: ignore[attr-defined]
    assert " over 1 sample;" in summary.getMessage(), summary.getMessage()
