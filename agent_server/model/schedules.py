"""`Schedule`: work that starts on its own, its cron read by cronsim in an IANA zone.

A schedule is checked whole when it is made, and a refusal names the field it refuses
(`ScheduleError.field`): the HTTP edge answers it as a 422 naming that field, echoing at
most `SHOWN_LENGTH` characters of what was sent. Fire times are Unix times; the expression
is read on the zone's wall clock, so every expression follows DST alike: a wall time a
spring change skips runs at the first time after it, and an autumn change's repeated hour
runs once (its first pass). cronsim alone does so only for a fixed minute and hour.
"""

from __future__ import annotations

import dataclasses
import enum
import functools
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from cronsim import CronSim, CronSimError
from pydantic import ValidationError

from agent_server.model.counts import counted
from agent_server.model.echoes import SHOWN_LENGTH, shown
from agent_server.model.names import SESSION_ID_PATTERN, SESSION_ID_RULE, is_session_id
from agent_server.model.schedule_fields import DEFAULT_CATCHUP_WINDOW, MAX_CATCHUP_WINDOW, OVERLAPS


class FiringOutcome(enum.StrEnum):
    """What one firing did."""

    #: Started by this call.
    STARTED = "started"
    #: Started before (by another replica, or an earlier try): not counted again.
    DUPLICATE = "duplicate"
    #: The previous firing still runs (overlap `skip`, or `buffer_one` with one waiting).
    SKIPPED = "skipped"
    #: Its time passed while nobody could fire it (outside the catch-up window).
    MISSED = "missed"
    #: Its input no longer binds its reasoner (a release changed its parameters).
    INVALID = "invalid"


#: What became of a firing, as `schedule_firings_total` counts it (a duplicate is counted
#: where it started).
FIRING_OUTCOMES = tuple(o for o in FiringOutcome if o is not FiringOutcome.DUPLICATE)


#: The longest cron expression taken: every tick of every replica reads it again.
MAX_CRON_LENGTH = 256


#: The most missed firings counted one by one after a gap: counting walks every fire time,
#: and a long outage of an every-second schedule holds a million of them.
MAX_COUNTED = 100_000

#: Five plain cron fields (a number in the field's range, `*`, or `*/step`), every one of
#: which cronsim reads: the OpenAPI document's pattern for a request's `cron`. More is
#: accepted (six fields with seconds first, ranges, lists, names, `L`, `#`); the pattern
#: only promises that what matches it is never refused.
_EVERY = r"\*(/[1-9][0-9]?)?"
PLAIN_CRON_PATTERN = (
    rf"^({_EVERY}|[1-5]?[0-9]) ({_EVERY}|1?[0-9]|2[0-3]) ({_EVERY}|[1-9]|1[0-9]|2[0-8])"
    rf" ({_EVERY}|[1-9]|1[0-2]) ({_EVERY}|[0-7])$"
)


@functools.cache
def known_zones() -> frozenset[str]:
    """The IANA zones a schedule may name: those this machine's tzdata lists, but
    `localtime` (this host's own setting, which another replica may not share: their fire
    times, and so their firings' ids, would differ). A name outside, `right/UTC` or
    `posix/...` included, is refused: every replica reads the same zone."""
    return frozenset(available_timezones()) - {"localtime"}


def _zones() -> str:
    """The zones a schedule may name (`known_zones`), as a pattern of alternatives (names
    hold letters, digits, '/', '_', '-' and '+'): cheaper for a client to check, and for a
    fuzzer to draw from, than an enum of 600 values."""
    names = sorted(known_zones())
    return "^(" + "|".join(name.replace("+", r"\+") for name in names) + ")$"


def _schema(shown: dict[str, Any], **request: Any) -> dict[str, Any]:
    """A field's JSON schema as the API shows it, and what a request's schema adds to it
    (a callable is called when the schema is made)."""
    return {"shown": shown, "request": request}


def field_schemas(request: bool) -> dict[str, dict[str, Any]]:
    """Each field's JSON schema, from its declaration: as a schedule shows it, or (with
    `request`) as a request gives it, with its default (the OpenAPI document's)."""
    made: dict[str, dict[str, Any]] = {}
    for declared in dataclasses.fields(Schedule):
        schema = dict(declared.metadata["shown"])
        if request:
            extra = declared.metadata["request"]
            schema.update({k: v() if callable(v) else v for k, v in extra.items()})
            if declared.default is not dataclasses.MISSING:
                schema["default"] = declared.default
            elif declared.default_factory is not dataclasses.MISSING:
                schema["default"] = declared.default_factory()
        made[declared.name] = schema
    return made


def binding_problem(exc: ValidationError) -> str:
    """Why an input does not bind, without echoing it: the first error's place (cut) and
    pydantic's message (which names the expected type, not the value), and how many more."""
    errors = exc.errors(include_url=False, include_context=False)
    if not errors:
        return "does not bind the reasoner's parameters"
    first = errors[0]
    place = ".".join(str(part) for part in first["loc"]) or "(the object)"
    if not (place.isprintable() and len(place) <= SHOWN_LENGTH):
        place = shown(place)
    message = first["msg"]
    if len(message) > 2 * SHOWN_LENGTH:
        message = message[: 2 * SHOWN_LENGTH] + "..."
    more = f" (and {counted(len(errors) - 1, 'more error')})" if len(errors) > 1 else ""
    return f"{place}: {message}{more}"


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
    if len(cron) > MAX_CRON_LENGTH:
        raise ScheduleError("cron", f"is longer than {MAX_CRON_LENGTH} characters")
    count = len(cron.split())
    if count not in (5, 6):
        raise ScheduleError(
            "cron", f"has {counted(count, 'field')}: five, or six with seconds first"
        )
    try:
        CronSim(cron, datetime(2000, 1, 1, tzinfo=UTC))
    except CronSimError as exc:
        raise ScheduleError("cron", f"{shown(cron)}: {exc}") from None
    return " ".join(cron.split())


def zone(name: object) -> ZoneInfo:
    """The IANA zone called `name`, or a refusal naming `timezone`."""
    if not isinstance(name, str) or not name or len(name) > 64:
        raise ScheduleError("timezone", "must be an IANA time zone name, such as Europe/Paris")
    if name not in known_zones():
        raise ScheduleError("timezone", f"{shown(name)} is not an IANA time zone")
    try:
        return ZoneInfo(name)
    except (ZoneInfoNotFoundError, ValueError):
        raise ScheduleError("timezone", f"{shown(name)} is not an IANA time zone") from None


@dataclass(frozen=True, slots=True)
class Schedule:
    """Start the reasoner it is declared on with `input` at each time `cron` names.

    `cron`: five fields, or six with seconds first (`*/2 * * * * *`: every 2 s), read in
    `timezone` (IANA, default UTC). `overlap`: what a firing does while the previous one
    runs (`OVERLAPS`). `catchup_window`: missed firings younger than this many seconds,
    counted back from the moment a replica fires again, start late, once each; older ones
    are counted as missed. `session_id`: the session its executions start in.
    """

    cron: str = field(
        metadata=_schema({"type": "string"}, pattern=PLAIN_CRON_PATTERN, maxLength=MAX_CRON_LENGTH)
    )
    input: Mapping[str, Any] = field(default_factory=dict, metadata=_schema({"type": "object"}))
    timezone: str = field(default="UTC", metadata=_schema({"type": "string"}, pattern=_zones))
    overlap: str = field(default="skip", metadata=_schema({"enum": list(OVERLAPS)}))
    catchup_window: float = field(
        default=DEFAULT_CATCHUP_WINDOW,
        metadata=_schema({"type": "number", "minimum": 0, "maximum": MAX_CATCHUP_WINDOW}),
    )
    session_id: str | None = field(
        default=None,
        metadata=_schema(
            {"type": ["string", "null"], "maxLength": 256, "pattern": SESSION_ID_PATTERN}
        ),
    )
    enabled: bool = field(default=True, metadata=_schema({"type": "boolean"}))

    def __post_init__(self) -> None:
        object.__setattr__(self, "cron", cron_fields(self.cron))
        zone(self.timezone)
        if not isinstance(self.input, Mapping):
            raise ScheduleError("input", "must be a JSON object (the reasoner's arguments)")
        if self.overlap not in OVERLAPS:
            raise ScheduleError("overlap", f"must be one of {', '.join(OVERLAPS)}")
        window = self.catchup_window
        # Compared, not converted: an integer past a float's range (JSON has them) is simply
        # out of range, and NaN fails every comparison.
        if (
            isinstance(window, bool)
            or not isinstance(window, int | float)
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

    @property
    def timing(self) -> str:
        """What its fire times are made of (its cron and zone): the store's marks keep the
        one they were handled with, so a change of it is seen by every replica."""
        return f"{self.cron}\x1f{self.timezone}"

    def fire_times(self, after: float, until: float) -> Iterator[float]:
        """The fire times in (`after`, `until`], Unix times, in order."""
        for at in self._moments(after):
            if at > until:
                return
            yield at

    def next_fire(self, after: float) -> float:
        """The first fire time after `after`."""
        for at in self._moments(after):
            return at
        raise ScheduleError("cron", "never fires")  # pragma: no cover: cronsim iterates on

    def count_fire_times(self, after: float, until: float, limit: int = MAX_COUNTED) -> int:
        """How many fire times (`after`, `until`] holds, at most `limit`: walking them is
        the only exact count, so a long gap is walked in a thread, never on the loop."""
        count = 0
        for _ in self.fire_times(after, until):
            count += 1
            if count >= limit:
                break
        return count

    def _moments(self, after: float) -> Iterator[float]:
        """The fire times after `after`, ascending: the expression is matched against the
        zone's wall clock (cronsim on naive times), and each wall time becomes the instant
        it names; a repeated wall time its first pass, a skipped one the first instant
        after it. So every expression, with seconds or not, follows DST as the docs say."""
        tz = zone(self.timezone)
        start = datetime.fromtimestamp(math.floor(after), tz).replace(tzinfo=None)
        last = after
        for wall in CronSim(self.cron, start):
            at = _instant(wall, tz)
            if at > last:  # a second pass, or a skipped hour's wall times folded into one
                last = at
                yield at


def _instant(wall: datetime, tz: ZoneInfo) -> float:
    """The Unix time of the wall time `wall` in `tz`: the first pass of a repeated one
    (fold 0), the first instant after a skipped one (a spring change's gap)."""
    aware = wall.replace(tzinfo=tz, fold=0)
    at = aware.timestamp()
    if datetime.fromtimestamp(at, tz).replace(tzinfo=None) == wall:
        return at
    # In a gap, fold 0 and fold 1 give instants either side of the change: the first
    # instant whose wall time is not before `wall` lies between them.
    other = wall.replace(tzinfo=tz, fold=1).timestamp()
    low, high = math.floor(min(at, other)), math.ceil(max(at, other))
    while low < high:
        middle = (low + high) // 2
        if datetime.fromtimestamp(middle, tz).replace(tzinfo=None) >= wall:
            high = middle
        else:
            low = middle + 1
    return float(low)
