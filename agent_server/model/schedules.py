"""`Schedule`: work that starts on its own, its cron read by cronsim in an IANA zone.

A schedule is checked whole when it is made, and a refusal names the field it refuses
(`ScheduleError.field`): the HTTP edge answers it as a 422 naming that field. Fire times are
Unix times; the expression is evaluated in the schedule's zone, DST included (cronsim skips
the hour a spring change removes and runs an autumn change's repeated hour once).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError, available_timezones

from cronsim import CronSim, CronSimError

from agent_server.model.counts import counted
from agent_server.model.names import SESSION_ID_PATTERN, SESSION_ID_RULE, is_session_id

#: What a firing does when the previous firing of its schedule is still running (Temporal's
#: names): skip it, keep one waiting, start it anyway, or cancel the previous one.
OVERLAPS = ("skip", "buffer_one", "allow_all", "cancel_other")

#: What became of a firing, as `schedule_firings_total` counts it.
FIRING_OUTCOMES = ("started", "skipped", "missed")

#: How far back a replica firing again starts missed firings, by default (seconds).
DEFAULT_CATCHUP_WINDOW = 60.0

#: The longest catch-up window: a day (a longer outage's firings are counted as missed).
MAX_CATCHUP_WINDOW = 86_400.0


#: The longest cron expression taken: every tick of every replica reads it again, and a
#: refusal echoes it.
MAX_CRON_LENGTH = 256

#: Five plain cron fields (a number in the field's range, `*`, or `*/step`), every one of
#: which cronsim reads: the OpenAPI document's pattern for a request's `cron`. More is
#: accepted (six fields with seconds first, ranges, lists, names, `L`, `#`); the pattern
#: only promises that what matches it is never refused.
_EVERY = r"\*(/[1-9][0-9]?)?"
PLAIN_CRON_PATTERN = (
    rf"^({_EVERY}|[1-5]?[0-9]) ({_EVERY}|1?[0-9]|2[0-3]) ({_EVERY}|[1-9]|1[0-9]|2[0-8])"
    rf" ({_EVERY}|[1-9]|1[0-2]) ({_EVERY}|[0-7])$"
)


def _zones() -> str:
    """The IANA zones this machine knows (tzdata), as a pattern of alternatives (names hold
    letters, digits, '/', '_', '-' and '+'): cheaper for a client to check, and for a
    fuzzer to draw from, than an enum of 600 values."""
    names = sorted(available_timezones())
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
