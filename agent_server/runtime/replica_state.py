"""What this replica says of itself to the console's replicas view (`GET /replicas`): its
id, the versions it runs, whether it admits work or drains, how many executions it runs,
and during a shutdown its phase and the seconds left until that phase's planned end."""

from __future__ import annotations

import json
import time
from typing import Any

from agent_server.runtime.registry import InFlightRegistry
from agent_server.runtime.shutdown import ShutdownSequence


def versions_of(advert: str) -> list[str | None]:
    """The distinct versions a replica's advert (versions.py `advert`) names, None for
    unversioned, in order."""
    try:
        rules = json.loads(advert) if advert else {}
    except ValueError:
        return []
    found = {str(rule[0]) for rule in rules.values() if isinstance(rule, list) and rule}
    return [version or None for version in sorted(found)]


def replica_state(
    replica_id: str, advert: str, registry: InFlightRegistry, shutdown: ShutdownSequence
) -> dict[str, Any]:
    """This replica now. `deadline_at` is a wall-clock time, so another replica can tell
    the seconds left from it (their clocks agreeing, as Kubernetes nodes' do, by NTP)."""
    ends = shutdown.phase_ends
    deadline_at = None if ends is None else time.time() + (ends - time.monotonic())
    return {
        "replica_id": replica_id,
        "versions": versions_of(advert),
        "admitting": registry.admitting,
        "draining": registry.draining,
        "in_flight": registry.inflight,
        "phase": shutdown.phase.value,
        "deadline_at": deadline_at,
    }
