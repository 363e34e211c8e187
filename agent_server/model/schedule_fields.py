"""A schedule's enumerations and bounds, apart from the schedule itself (schedules.py): the
CLI's schedules verbs read them (their choices, their help) without loading pydantic or
cronsim, so what the CLI says and what the server allows are one declaration."""

from __future__ import annotations

#: What a firing does when the previous firing of its schedule is still running (Temporal's
#: names): skip it, keep one waiting, start it anyway, or cancel the previous one.
OVERLAPS = ("skip", "buffer_one", "allow_all", "cancel_other")

#: How far back a replica firing again starts missed firings, by default (seconds).
DEFAULT_CATCHUP_WINDOW = 60.0

#: The longest catch-up window: a day (a longer outage's firings are counted as missed).
MAX_CATCHUP_WINDOW = 86_400.0
