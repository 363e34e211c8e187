"""`Schedule`: cron read with seconds or without, in an IANA zone through DST; a refusal
names its field."""

from __future__ import annotations

from datetime import datetime
from typing import Any
from zoneinfo import ZoneInfo

import pytest

from agent_server import Agent, Schedule
from agent_server.model.reasoner import ReasonerDefinitionError
from agent_server.model.schedules import ScheduleError

PARIS = ZoneInfo("Europe/Paris")


def _at(*parts: int, tz: ZoneInfo = PARIS) -> float:
    return datetime(*parts, tzinfo=tz).timestamp()  # type: ignore[misc]


def test_six_fields_put_seconds_first() -> None:
    schedule = Schedule("*/2 * * * * *")
    start = _at(2026, 1, 1, 0, 0, 0)
    assert list(schedule.fire_times(start, start + 7)) == [start + 2, start + 4, start + 6]
    # Five fields: minutes first, at second 0.
    assert list(Schedule("*/5 * * * *").fire_times(start, start + 900)) == [
        start + 300,
        start + 600,
        start + 900,
    ]


def test_fire_times_are_after_and_up_to() -> None:
    schedule = Schedule("* * * * * *")
    start = _at(2026, 6, 1, 12, 0, 0)
    assert list(schedule.fire_times(start, start)) == []
    assert list(schedule.fire_times(start + 0.5, start + 2)) == [start + 1, start + 2]
    assert schedule.next_fire(start + 0.5) == start + 1


def test_spring_forward_skips_the_missing_hour_and_autumn_runs_the_repeated_one_once() -> None:
    daily = Schedule("30 2 * * *", timezone="Europe/Paris")
    # 2026-03-29: 02:00 to 03:00 does not exist in Paris; the firing of that day is at 03:00.
    spring = list(daily.fire_times(_at(2026, 3, 28, 12, 0, 0), _at(2026, 3, 30, 12, 0, 0)))
    assert [datetime.fromtimestamp(t, PARIS).hour for t in spring] == [3, 2]
    # 2026-10-25: 02:30 happens twice in Paris; it fires once.
    night = Schedule("30 2 * * *", timezone="Europe/Paris")
    autumn = list(night.fire_times(_at(2026, 10, 24, 12, 0, 0), _at(2026, 10, 26, 12, 0, 0)))
    assert len(autumn) == 2
    assert autumn[1] - autumn[0] == 86_400 + 3600  # the night had 25 hours
    # The same expression in UTC does not move.
    utc = Schedule("30 2 * * *")
    assert list(utc.fire_times(_at(2026, 3, 28, 12, 0, 0), _at(2026, 3, 29, 12, 0, 0))) == [
        _at(2026, 3, 29, 2, 30, 0, tz=ZoneInfo("UTC"))
    ]


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"cron": "* * *"}, "cron"),
        ({"cron": "* * * * * * *"}, "cron"),
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "0 0 30 2 *"}, "cron"),
        ({"cron": 5}, "cron"),
        ({"cron": "* * * * *", "timezone": "Mars/Olympus"}, "timezone"),
        ({"cron": "* * * * *", "timezone": "../../etc/passwd"}, "timezone"),
        ({"cron": "* * * * *", "timezone": ""}, "timezone"),
        # Not the same on every replica: the host's own zone, a leap-second variant.
        ({"cron": "* * * * *", "timezone": "localtime"}, "timezone"),
        ({"cron": "* * * * *", "timezone": "right/UTC"}, "timezone"),
        ({"cron": "* * * * *", "timezone": "posix/Europe/Paris"}, "timezone"),
        ({"cron": "* * * * *", "overlap": "queue"}, "overlap"),
        ({"cron": "* * * * *", "catchup_window": -1}, "catchup_window"),
        ({"cron": "* * * * *", "catchup_window": float("nan")}, "catchup_window"),
        ({"cron": "* * * * *", "catchup_window": True}, "catchup_window"),
        ({"cron": "* * * * *", "catchup_window": 10**9}, "catchup_window"),
        ({"cron": "* * * * *", "catchup_window": 10**400}, "catchup_window"),
        ({"cron": "* * * * *", "catchup_window": -(10**400)}, "catchup_window"),
        ({"cron": "* * * * *", "session_id": "a b"}, "session_id"),
        ({"cron": "* * * * *", "input": [1]}, "input"),
        ({"cron": "* * * * *", "enabled": "yes"}, "enabled"),
    ],
)
def test_a_refusal_names_its_field(kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(ScheduleError) as caught:
        Schedule(**kwargs)
    assert caught.value.field == field
    assert str(caught.value).startswith(f"{field}: ")


def test_declared_on_a_reasoner_its_input_binds_once() -> None:
    agent = Agent("t")

    @agent.reasoner(schedules=[Schedule("*/2 * * * * *", input={"n": 3})])
    async def count(n: int) -> int:
        return n

    assert agent.reasoners["count"].schedules[0].input == {"n": 3}
    with pytest.raises(ReasonerDefinitionError, match="does not bind"):

        @agent.reasoner(schedules=[Schedule("* * * * *", input={"n": "three"})])
        async def other(n: int) -> int:
            return n

    with pytest.raises(ReasonerDefinitionError, match="Schedule"):

        @agent.reasoner(schedules=["* * * * *"])  # type: ignore[list-item]
        async def third() -> None:
            return None


class _Registry:
    """A registry's start, under the use case every front starts with (`Starts`): refused
    (no room) the first `refuse` times, then started."""

    def __init__(self, refuse: int) -> None:
        self.refuse = refuse
        self.fired: list[float | None] = []

    async def start_once(
        self, reasoner: Any, arguments: Any, session_id: Any, **kwargs: Any
    ) -> tuple[Any, bool]:
        from agent_server.model.execution import Execution
        from agent_server.runtime.admission import AdmissionError
        from agent_server.runtime.registry import RejectReason

        execution = Execution(reasoner.name, session_id)
        kwargs["announce"](execution)
        self.fired.append(execution.scheduled_at)
        if len(self.fired) <= self.refuse:
            raise AdmissionError(RejectReason.CAPACITY)
        return execution, True


async def test_a_refused_firing_retries_its_own_fire_time_and_a_change_fires_nothing() -> None:
    from agent_server.runtime.schedule_entries import Entry

    clock = [1000.0]
    registry = _Registry(refuse=1)
    ticker = _ticker(registry, clock)
    ticker.add(Entry("s", "work", Schedule("*/10 * * * * *")))
    await ticker.tick()  # primed at 1000: nothing before it runs
    assert registry.fired == []
    clock[0] = 1010.0
    await ticker.tick()
    clock[0] = 1010.4  # past the retry (0.25 s later): the same fire time, not 1010.25
    await ticker.tick()
    assert registry.fired == [1010.0, 1010.0]
    # Changed (PATCH) between two fire times: nothing fires before the next one.
    ticker.add(Entry("s", "work", Schedule("*/10 * * * * *", input={})))
    clock[0] = 1015.0
    await ticker.tick()
    await ticker.tick()
    assert registry.fired == [1010.0, 1010.0]
    clock[0] = 1020.0
    await ticker.tick()
    assert registry.fired == [1010.0, 1010.0, 1020.0]


# -- DST on the wall clock, for every expression (docs/schedules.md, Fields: timezone) --------


def _local(times: list[float]) -> list[str]:
    return [datetime.fromtimestamp(t, PARIS).strftime("%H:%M:%S%z") for t in times]


@pytest.mark.parametrize(
    ("cron", "day", "expected"),
    [
        # Autumn (2026-10-25, 03:00 CEST -> 02:00 CET): the repeated hour runs once, its
        # first pass, whatever the minute field; a wildcard hour has no firing in the second.
        (
            "*/15 2 * * *",
            (2026, 10, 25),
            ["02:00:00+0200", "02:15:00+0200", "02:30:00+0200", "02:45:00+0200"],
        ),
        ("0 */2 * * *", (2026, 10, 25), ["00:00:00+0200", "02:00:00+0200", "04:00:00+0100"]),
        (
            "*/30 1-3 * * *",
            (2026, 10, 25),
            [
                "01:00:00+0200",
                "01:30:00+0200",
                "02:00:00+0200",
                "02:30:00+0200",
                "03:00:00+0100",
                "03:30:00+0100",
            ],
        ),
        ("0 30 2 * * *", (2026, 10, 25), ["02:30:00+0200"]),  # six fields too
        # Spring (2026-03-29, 02:00 CET -> 03:00 CEST): a firing in the missing hour runs at
        # the first time after it, once.
        ("0 */2 * * *", (2026, 3, 29), ["00:00:00+0100", "03:00:00+0200", "04:00:00+0200"]),
        ("*/15 2 * * *", (2026, 3, 29), ["03:00:00+0200"]),
        ("0 0,30 2,3 * * *", (2026, 3, 29), ["03:00:00+0200", "03:30:00+0200"]),
        ("30 2 * * *", (2026, 3, 29), ["03:00:00+0200"]),
    ],
)
def test_every_expression_follows_dst_on_the_wall_clock(
    cron: str, day: tuple[int, int, int], expected: list[str]
) -> None:
    schedule = Schedule(cron, timezone="Europe/Paris")
    start = _at(*day, 0, 0, 0)
    until = _at(*day, 5, 0, 0)
    times = list(schedule.fire_times(start - 1, until))
    assert _local(times) == expected
    # next_fire walks the same times, from any point, also inside the repeated hour.
    walked, at = [], start - 1
    while (at := schedule.next_fire(at)) <= until:
        walked.append(at)
    assert walked == times


def test_an_every_second_schedule_skips_the_repeated_hour_s_second_pass() -> None:
    schedule = Schedule("* * * * * *", timezone="Europe/Paris")
    first_pass_end = _at(2026, 10, 25, 2, 59, 59)
    second_pass = datetime(2026, 10, 25, 2, 10, 0, tzinfo=PARIS, fold=1).timestamp()
    assert schedule.next_fire(first_pass_end) == first_pass_end + 3601  # 03:00:00 CET
    assert _local([schedule.next_fire(second_pass)]) == ["03:00:00+0100"]


def test_counting_fire_times_stops_at_its_limit() -> None:
    schedule = Schedule("* * * * * *")
    start = _at(2026, 6, 1, 0, 0, 0)
    assert schedule.count_fire_times(start, start + 10) == 10
    assert schedule.count_fire_times(start, start + 14 * 86_400, limit=500) == 500


# -- the ticker, with the process's store and a stand-in for the registry's start -----------


def _ticker(registry: Any, clock: list[float], seen: list[str] | None = None) -> Any:
    """A ticker whose firings start through the real use case (`Starts`), over `registry`:
    what the registry raises reaches the ticker as the `Refusal` a front's start gets."""
    from agent_server.model.waiting import Closing
    from agent_server.service.access import Access
    from agent_server.service.schedule_ticker import ScheduleTicker
    from agent_server.service.starts import Starts
    from agent_server.store.memory import MemoryStore

    agent = Agent("t")

    @agent.reasoner()
    async def work() -> None:
        return None

    store = MemoryStore("r1")
    outcomes = [] if seen is None else seen
    return ScheduleTicker(
        Starts(registry, store, Access(), Closing(), idempotency_ttl=60.0, webhook_url=None),
        store,
        agent.reasoners,
        observe=lambda outcome, lag: outcomes.append(outcome),
        draining=lambda: False,
        clock=lambda: clock[0],
    )


async def test_catchup_window_0_starts_an_on_time_firing_however_late_its_tick() -> None:
    """0 means no catch-up, not never: the tick always runs a little after the fire time."""
    from agent_server.runtime.schedule_entries import Entry

    clock = [1000.0]
    registry, outcomes = _Registry(refuse=0), []
    ticker = _ticker(registry, clock, outcomes)
    ticker.add(Entry("s", "work", Schedule("*/10 * * * * *", catchup_window=0)))
    await ticker.tick()  # primed at 1000
    clock[0] = 1010.02  # the tick's own lateness
    await ticker.tick()
    clock[0] = 1023.5  # a loaded machine: the loop came back 3.5 s late
    await ticker.tick()
    assert registry.fired == [1010.0, 1020.0]
    assert outcomes == ["started", "started"]
    # A replica coming up after a gap (no replica up) runs none of the gap's fire times.
    later = _ticker(registry, clock, outcomes)
    later.store = ticker.store
    later.add(Entry("s", "work", Schedule("*/10 * * * * *", catchup_window=0)))
    clock[0] = 1065.0
    await later.tick()
    assert registry.fired == [1010.0, 1020.0]
    assert outcomes.count("missed") == 4  # 1030, 1040, 1050, 1060
    clock[0] = 1070.3
    await later.tick()
    assert registry.fired == [1010.0, 1020.0, 1070.0]


async def test_a_changed_cron_fires_nothing_from_before_the_change() -> None:
    from agent_server.runtime.schedule_entries import Entry

    clock = [1000.0]
    registry = _Registry(refuse=0)
    ticker = _ticker(registry, clock)
    await ticker.keep(Entry("s", "work", Schedule("0 0 1 1 *", overlap="allow_all")))
    await ticker.tick()  # primed at 1000: yearly, nothing due
    clock[0] = 1008.5
    await ticker.keep(Entry("s", "work", Schedule("* * * * * *", overlap="allow_all")))
    await ticker.tick()
    assert registry.fired == []  # not 1001 to 1008 in a burst
    # A replica reading the changed document (or coming up) starts after the change too:
    # the change moved the store's mark.
    other = _ticker(registry, clock)
    other.store = ticker.store
    other.add(Entry("s", "work", Schedule("* * * * * *", overlap="allow_all")))
    await other.tick()
    assert registry.fired == []
    clock[0] = 1009.1
    await ticker.tick()
    await other.tick()
    assert registry.fired == [1009.0, 1009.0]  # each replica's start; the store makes it one


class _Raises(_Registry):
    """A start that raises something no one planned for, once."""

    async def start_once(
        self, reasoner: Any, arguments: Any, session_id: Any, **kwargs: Any
    ) -> tuple[Any, bool]:
        if not self.fired:
            self.fired.append(None)
            raise RuntimeError("a store error nobody mapped")
        return await super().start_once(reasoner, arguments, session_id, **kwargs)


async def test_a_firing_that_raises_keeps_its_schedule_and_is_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    from agent_server.runtime.schedule_entries import Entry

    clock = [1000.0]
    registry = _Raises(refuse=0)
    ticker = _ticker(registry, clock)
    ticker.add(Entry("s", "work", Schedule("*/10 * * * * *")))
    await ticker.tick()
    clock[0] = 1010.0
    await ticker.tick()  # raises inside: tried again, not dropped
    clock[0] = 1010.3
    await ticker.tick()
    clock[0] = 1020.0
    await ticker.tick()
    assert registry.fired == [None, 1010.0, 1020.0]
    failures = [r for r in caplog.records if "firing failed" in r.getMessage()]
    assert len(failures) == 1


class _Forgotten(_Registry):
    async def start_once(
        self, reasoner: Any, arguments: Any, session_id: Any, **kwargs: Any
    ) -> tuple[Any, bool]:
        from agent_server.store.base import IdempotencyForgotten

        raise IdempotencyForgotten()


async def test_a_trigger_whose_moment_was_forgotten_has_no_execution() -> None:
    """The route answers 409 for it (http/schedules.py), never an assertion's 500."""
    from agent_server.runtime.schedule_entries import Entry

    ticker = _ticker(_Forgotten(refuse=0), [1000.0])
    entry = Entry("s", "work", Schedule("0 0 1 1 *", overlap="allow_all"))
    ticker.add(entry)
    firing = await ticker.trigger(entry)
    assert firing.outcome == "duplicate" and firing.execution is None


# -- the seam: a firing starts through the use case, whose refusals the ticker maps -----------


class _Refuses:
    """A registry whose start raises `exc` every time, once its execution was stamped."""

    def __init__(self, exc: Exception) -> None:
        self.exc = exc
        self.tried: list[float | None] = []

    async def start_once(
        self, reasoner: Any, arguments: Any, session_id: Any, **kwargs: Any
    ) -> tuple[Any, bool]:
        from agent_server.model.execution import Execution

        execution = Execution(reasoner.name, session_id)
        kwargs["announce"](execution)
        self.tried.append(execution.scheduled_at)
        raise self.exc


def _raised(name: str) -> Exception:
    """What the registry (or the store under it) raises, by name: built here, so that the
    parameters' ids read as the cases and nothing is imported at collection."""
    from agent_server.runtime.admission import AdmissionError
    from agent_server.runtime.observer import RejectReason
    from agent_server.store.base import IdempotencyForgotten, IdempotencyMismatch, SessionTaken

    return {
        "capacity": AdmissionError(RejectReason.CAPACITY),
        "draining": AdmissionError(RejectReason.DRAINING),
        "session released": AdmissionError(RejectReason.SESSION_RELEASED),
        "store unavailable": AdmissionError(RejectReason.STORE_UNAVAILABLE),
        "in doubt": AdmissionError(RejectReason.STORE_UNAVAILABLE, "e1"),
        "key mismatch": IdempotencyMismatch(),
        "key forgotten": IdempotencyForgotten(),
        "session taken": SessionTaken("e0"),
    }[name]


@pytest.mark.parametrize(
    ("raised", "tries", "logged"),
    [
        # Refused for now (Why in RETRIED): the same fire time again soon, nothing logged.
        ("capacity", [1010.0, 1010.0], False),
        ("draining", [1010.0, 1010.0], False),
        ("session released", [1010.0, 1010.0], False),
        ("store unavailable", [1010.0, 1010.0], False),
        ("in doubt", [1010.0, 1010.0], False),
        # Its key refused: the duplicate of a start before it, done; on to the next.
        ("key mismatch", [1010.0], False),
        ("key forgotten", [1010.0], False),
        # Any other refusal is a failure: logged once, tried again inside its window.
        ("session taken", [1010.0, 1010.0], True),
    ],
)
async def test_a_firing_the_use_case_refuses_ends_as_the_ticker_ended_that_refusal(
    raised: str, tries: list[float], logged: bool, caplog: pytest.LogCaptureFixture
) -> None:
    from agent_server.runtime.schedule_entries import Entry

    clock, outcomes = [1000.0], []
    registry = _Refuses(_raised(raised))
    ticker = _ticker(registry, clock, outcomes)
    ticker.add(Entry("s", "work", Schedule("*/10 * * * * *")))
    await ticker.tick()  # primed at 1000
    clock[0] = 1010.0
    await ticker.tick()
    clock[0] = 1010.3  # past RETRY_AFTER: a retry, if it is one
    await ticker.tick()
    assert registry.tried == tries
    assert outcomes == []  # neither started nor missed: a duplicate is counted nowhere
    failures = [r for r in caplog.records if "firing failed" in r.getMessage()]
    assert len(failures) == (1 if logged else 0)


@pytest.mark.parametrize(
    ("raised", "why", "execution_id"),
    [
        ("capacity", "busy", None),
        ("draining", "shutting_down", None),
        ("session released", "session_releasing", None),
        ("store unavailable", "unavailable", None),
        ("in doubt", "in_doubt", "e1"),
    ],
)
async def test_a_trigger_the_use_case_refuses_raises_the_refusal_a_start_gets(
    raised: str, why: str, execution_id: str | None
) -> None:
    """The route lets it through to the front, which answers it as any start's refusal (429,
    503 with Location for one in doubt): the trigger's words are a start's."""
    from agent_server.runtime.schedule_entries import Entry
    from agent_server.service.refusals import Refusal, Why

    ticker = _ticker(_Refuses(_raised(raised)), [1000.0])
    entry = Entry("s", "work", Schedule("0 0 1 1 *", overlap="allow_all"))
    ticker.add(entry)
    with pytest.raises(Refusal) as refused:
        await ticker.trigger(entry)
    assert refused.value.why is Why(why)
    assert refused.value.execution_id == execution_id


async def test_a_firing_is_stamped_before_its_record_is_written_and_its_repeat_is_found() -> None:
    """Through the real registry and store: the record is written with the firing's id,
    schedule and fire time, and the same fire time again is the duplicate of that record."""
    from agent_server.model.execution import ExecutionStatus
    from agent_server.model.waiting import Closing
    from agent_server.runtime.schedule_entries import Entry, firing_id
    from agent_server.service.access import Access
    from agent_server.service.schedule_ticker import ScheduleTicker
    from agent_server.service.use_cases import UseCases
    from tests.support.local_parts import make_local

    local = await make_local()
    agent = Agent("t")

    @agent.reasoner()
    async def work() -> str:
        return "done"

    cases = UseCases(local.registry, local.store, Access(), Closing())
    outcomes: list[str] = []
    ticker = ScheduleTicker(
        cases.starts,
        local.store,
        agent.reasoners,
        observe=lambda outcome, lag: outcomes.append(outcome),
        draining=lambda: local.registry.draining,
        clock=lambda: 1010.5,
    )
    entry = Entry("s", "work", Schedule("*/10 * * * * *", overlap="allow_all"))
    first = await ticker.fire(entry, 1010.0)
    again = await ticker.fire(entry, 1010.0)  # another replica's, or a retry's
    assert (first.outcome, again.outcome) == ("started", "duplicate")
    assert first.execution is not None and again.execution is not None
    assert first.execution.execution_id == again.execution.execution_id
    assert first.execution.execution_id == firing_id(entry.key, 1010.0)
    assert await first.execution.wait(5.0)
    record = await local.store.get(firing_id(entry.key, 1010.0))
    assert record is not None and record.status is ExecutionStatus.SUCCEEDED
    assert (record.schedule_id, record.scheduled_at) == ("s", 1010.0)
    assert outcomes == ["started"]


def test_the_agent_s_ticker_starts_through_the_use_case_every_front_uses() -> None:
    """The ticker is handed the fronts' `Starts`, and holds no registry to start around it."""
    from agent_server import Settings
    from agent_server.runtime.registry import InFlightRegistry

    agent = Agent("t", Settings())

    @agent.reasoner(schedules=[Schedule("0 0 1 1 *")])
    async def work() -> None:
        return None

    ticker = agent._ticker()
    assert ticker is agent._ticker()  # built once
    assert ticker.starts is agent._use_cases().starts
    assert "work-0" in ticker.declared
    assert not [value for value in vars(ticker).values() if isinstance(value, InFlightRegistry)]
