"""What the registry tells and counts: its observer (metrics), its totals, why it refuses.

Apart from the registry's parts so that each of them (admission, attempts, settling, input)
can name them without importing another part.
"""

from __future__ import annotations

import enum
from collections import Counter
from dataclasses import dataclass, field
from typing import Protocol

from agent_server.model.execution import Execution


class RejectReason(enum.StrEnum):
    DRAINING = "draining"
    CAPACITY = "capacity"
    SESSION_RELEASED = "session_released"
    STORE_UNAVAILABLE = "store_unavailable"


class RegistryObserver(Protocol):
    """Told what happened; never decides anything (metrics implements it)."""

    def execution_started(self, execution: Execution) -> None: ...

    def execution_finished(self, execution: Execution, outcome: str) -> None: ...

    def execution_rejected(self, reason: RejectReason) -> None: ...

    def event_emitted(self, execution: Execution) -> None: ...

    def input_waiting(self, execution: Execution, asked: bool, seconds: float) -> None: ...

    def execution_queued(self, execution: Execution, delta: int, waited: float | None) -> None:
        """One more queued (delta 1), or one fewer (-1: taken after `waited` seconds past
        its due time, or cancelled while queued: None)."""

    def execution_retried(self, execution: Execution, reason: str) -> None: ...


@dataclass
class RegistryStats:
    """Running totals; the shutdown report takes differences of these across its phases."""

    started: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)
    rejected: Counter[str] = field(default_factory=Counter)

    @property
    def ended(self) -> int:
        return sum(self.outcomes.values())
