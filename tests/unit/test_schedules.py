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


class _Starts:
    """A registry's start: refused (no room) the first `refuse` times, then started."""

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
    from agent_server.runtime.schedules import Entry, ScheduleTicker
    from agent_server.store.memory import MemoryStore

    agent = Agent("t")

    @agent.reasoner()
    async def work() -> None:
        return None

    clock = [1000.0]
    starts = _Starts(refuse=1)
    ticker = ScheduleTicker(
        starts,  # type: ignore[arg-type]
        MemoryStore("r1"),
        agent.reasoners,
        observe=lambda outcome, lag: None,
        draining=lambda: False,
        idempotency_ttl=60.0,
        clock=lambda: clock[0],
    )
    ticker.add(Entry("s", "work", Schedule("*/10 * * * * *")))
    await ticker.tick()  # primed at 1000: nothing before it runs
    assert starts.fired == []
    clock[0] = 1010.0
    await ticker.tick()
    clock[0] = 1010.4  # past the retry (0.25 s later): the same fire time, not 1010.25
    await ticker.tick()
    assert starts.fired == [1010.0, 1010.0]
    # Changed (PATCH) between two fire times: nothing fires before the next one.
    ticker.add(Entry("s", "work", Schedule("*/10 * * * * *", input={})))
    clock[0] = 1015.0
    await ticker.tick()
    await ticker.tick()
    assert starts.fired == [1010.0, 1010.0]
    clock[0] = 1020.0
    await ticker.tick()
    assert starts.fired == [1010.0, 1010.0, 1020.0]
