"""`Schedule`: work that starts on its own, its cron read by cronsim in an IANA zone.

A schedule is checked whole when it is made, and a refusal names the field it refuses
(`ScheduleError.field`): the HTTP edge answers it as a 422 naming that field. Fire times are
Unix times; the expression is evaluated in the schedule's zone, DST included (cronsim skips
the hour a spring change removes and runs an autumn change's repeated hour once).
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from cronsim import CronSim, CronSimError

from agent_server.model.counts import counted
from agent_server.model.names import SESSION_ID_RULE, is_session_id

#: What a firing does when the previous firing of its schedule is still running (Temporal's
#: names): skip it, keep one waiting, start it anyway, or cancel the previous one.
OVERLAPS = ("skip", "buffer_one", "allow_all", "cancel_other")

#: What became of a firing, as `schedule_firings_total` counts it.
FIRING_OUTCOMES = ("started", "skipped", "missed")

#: How far back a replica firing again starts missed firings, by default (seconds).
DEFAULT_CATCHUP_WINDOW = 60.0

#: The longest catch-up window: a day (a longer outage's firings are counted as missed).
MAX_CATCHUP_WINDOW = 86_400.0


class ScheduleError(ValueError):
    """A schedule refused: `field` names what is wrong (the API's 422 names it)."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message


def cron_fields(cron: object) -> str:
    """The expression, checked: five fields, or six with seconds first."""
    if not isinstance(cron, str):
        raise ScheduleError("cron", "must be a string")
    count = len(cron.split())
    if count not in (5, 6):
        raise ScheduleError(
            "cron", f"has {counted(count, 'field')}: five, or six with seconds first"
        )
    try:
        CronSim(cron, datetime(2000, 1, 1, tzinfo=UTC))
    except CronSimError as exc:
        raise ScheduleError("cron", f"{cron!r}: {exc}") from None
    return " ".join(cron.split())


def zone(name: object) -> ZoneInfo:
    """The IANA zone called `name`, or a refusal naming `timezone`."""
    if not isinstance(name, str) or not name or len(name) > 64:
        raise ScheduleError("timezone", "must be an IANA time zone name, such as Europe/Paris")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError("timezone", f"{name!r} is not an IANA time zone") from None


@dataclass(frozen=True, slots=True)
class Schedule:
    """Start the reasoner it is declared on with `input` at each time `cron` names.

    `cron`: five fields, or six with seconds first (`*/2 * * * * *`: every 2 s), read in
    `timezone` (IANA, default UTC). `overlap`: what a firing does while the previous one
    runs (`OVERLAPS`). `catchup_window`: missed firings younger than this many seconds,
    counted back from the moment a replica fires again, start late, once each; older ones
    are counted as missed. `session_id`: the session its executions start in.
    """

    cron: str
    input: Mapping[str, Any] = field(default_factory=dict)
    timezone: str = "UTC"
    overlap: str = "skip"
    catchup_window: float = DEFAULT_CATCHUP_WINDOW
    session_id: str | None = None
    enabled: bool = True

    def __post_init__(self) -> None:
        object.__setattr__(self, "cron", cron_fields(self.cron))
        zone(self.timezone)
        if not isinstance(self.input, Mapping):
            raise ScheduleError("input", "must be a JSON object (the reasoner's arguments)")
        if self.overlap not in OVERLAPS:
            raise ScheduleError("overlap", f"must be one of {', '.join(OVERLAPS)}")
        window = self.catchup_window
        if (
            isinstance(window, bool)
            or not isinstance(window, int | float)
            or not math.isfinite(window)
            or not 0 <= window <= MAX_CATCHUP_WINDOW
        ):
            raise ScheduleError(
                "catchup_window", f"must be a number of seconds from 0 to {MAX_CATCHUP_WINDOW:g}"
            )
        if self.session_id is not None and (
            not isinstance(self.session_id, str) or not is_session_id(self.session_id)
        ):
            raise ScheduleError("session_id", SESSION_ID_RULE)
        if not isinstance(self.enabled, bool):
            raise ScheduleError("enabled", "must be true or false")

    def fire_times(self, after: float, until: float) -> Iterator[float]:
        """The fire times in (`after`, `until`], Unix times, in order."""
        start = datetime.fromtimestamp(math.floor(after), zone(self.timezone))
        for moment in CronSim(self.cron, start):
            at = moment.timestamp()
            if at > until:
                return
            if at > after:
                yield at

    def next_fire(self, after: float) -> float:
        """The first fire time after `after`."""
        start = datetime.fromtimestamp(math.floor(after), zone(self.timezone))
        for moment in CronSim(self.cron, start):
            if moment.timestamp() > after:
                return moment.timestamp()
        raise ScheduleError("cron", "never fires")  # pragma: no cover: cronsim iterates on
