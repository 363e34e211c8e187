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
