"""A schedule as one replica fires it (`Entry`), what a firing did (`Firing`), and the id
of a firing's execution, the same on every replica (`firing_id`)."""

from __future__ import annotations

import dataclasses
import json
import time
import uuid
from dataclasses import dataclass
from typing import Any

from agent_server.identity.principal import Principal
from agent_server.model.execution import Execution
from agent_server.model.names import scoped
from agent_server.model.record import isoformat
from agent_server.model.schedules import FiringOutcome, Schedule

#: Ids derived from (schedule, fire time) live in their own UUID namespace.
_NAMESPACE = uuid.UUID("6f2c1d0e-5b1a-4d8e-9a55-3c1e0f7b2a41")


def firing_id(schedule_key: str, at: float) -> str:
    """The execution id of the firing at `at`: the same on every replica."""
    return uuid.uuid5(_NAMESPACE, f"{schedule_key}\x1f{at:.3f}").hex


@dataclass(eq=False)
class Entry:
    """One schedule as this replica fires it."""

    schedule_id: str
    reasoner: str
    schedule: Schedule
    #: The tenant it belongs to (None: declared, or no authentication) and who made it.
    principal: Principal | None = None
    declared: bool = False
    created_at: float | None = None
    #: Fire times up to this one are handled; None until the store's marks were read.
    cursor: float | None = None
    #: Its next fire time, and when the heap wakes for it (later, to retry a firing).
    next_at: float | None = None
    wake_at: float | None = None
    #: When this replica began firing it as it is (added, or changed): fire times after
    #: that are on time here, however late the tick that reaches them.
    since: float = 0.0
    #: The fire time tried and not started (refused, or its tick failed): a retry of it
    #: counts its lateness from the moment of the retry.
    tried: float | None = None
    #: The fire time whose failure was logged (-inf: reading its marks): one line a firing.
    logged: float | None = None
    removed: bool = False
    #: The JSON document the store keeps for it ('' for a declared one not changed).
    document: str = ""

    def view(self) -> dict[str, Any]:
        """What the API shows of it (docs/schedules.md)."""
        schedule = self.schedule
        next_at = schedule.next_fire(time.time()) if schedule.enabled else None
        return {
            "schedule_id": self.schedule_id,
            "reasoner": self.reasoner,
            "cron": schedule.cron,
            "timezone": schedule.timezone,
            "input": dict(schedule.input),
            "session_id": schedule.session_id,
            "overlap": schedule.overlap,
            "catchup_window": schedule.catchup_window,
            "enabled": schedule.enabled,
            "declared": self.declared,
            "next_fire_at": None if next_at is None else isoformat(next_at),
            "created_at": None if self.created_at is None else isoformat(self.created_at),
            "owner": None if self.principal is None else self.principal.identity,
            "tenant": self.tenant,
        }

    def to_document(self) -> str:
        """The JSON text the store keeps for every replica."""
        schedule = self.schedule
        return json.dumps(
            {
                "schedule_id": self.schedule_id,
                "reasoner": self.reasoner,
                "declared": self.declared,
                "created_at": self.created_at,
                "owner": None if self.principal is None else self.principal.identity,
                "tenant": self.tenant,
                "cron": schedule.cron,
                "timezone": schedule.timezone,
                "input": dict(schedule.input),
                "session_id": schedule.session_id,
                "overlap": schedule.overlap,
                "catchup_window": schedule.catchup_window,
                "enabled": schedule.enabled,
            },
            sort_keys=True,
        )

    @classmethod
    def from_document(cls, text: str) -> Entry:
        doc = json.loads(text)
        principal = None if doc["owner"] is None else Principal(doc["owner"], doc["tenant"])
        schedule = Schedule(
            doc["cron"],
            input=doc["input"],
            timezone=doc["timezone"],
            overlap=doc["overlap"],
            catchup_window=doc["catchup_window"],
            session_id=doc["session_id"],
            enabled=doc["enabled"],
        )
        return cls(
            doc["schedule_id"],
            doc["reasoner"],
            schedule,
            principal=principal,
            declared=doc["declared"],
            created_at=doc["created_at"],
            document=text,
        )

    def overridden(self, enabled: bool, document: str = "") -> Entry:
        """A declared schedule as its reasoner declares it in this release, with the one
        thing PATCH may change on it (`enabled`) taken from the store's `document`."""
        schedule = dataclasses.replace(self.schedule, enabled=enabled)
        return Entry(self.schedule_id, self.reasoner, schedule, declared=True, document=document)

    @property
    def tenant(self) -> str | None:
        return None if self.principal is None else self.principal.tenant

    @property
    def key(self) -> str:
        """Its name in the store: its id, as its tenant's."""
        return scoped(self.tenant, self.schedule_id)


def retimed(old: Schedule, new: Schedule) -> bool:
    """Whether a change gives the schedule other fire times from now on (a cron or a zone
    of its own, or enabled again): none of them before the change may run."""
    return (old.cron, old.timezone) != (new.cron, new.timezone) or (new.enabled and not old.enabled)


class Firing:
    """What one firing did: `started` (by this call), `duplicate` (started before: its
    execution, None if since forgotten), `skipped` (the previous one, still running) or
    `invalid` (its input no longer binds: `problem` says why)."""

    __slots__ = ("execution", "outcome", "problem")

    def __init__(
        self, outcome: FiringOutcome, execution: Execution | None = None, problem: str = ""
    ) -> None:
        self.outcome = outcome
        self.execution = execution
        self.problem = problem

    @property
    def began(self) -> bool:
        """Its own execution exists (started here or by another replica)."""
        began = (FiringOutcome.STARTED, FiringOutcome.DUPLICATE)
        return self.outcome in began and self.execution is not None
