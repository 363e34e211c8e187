"""Schedules in this process (the memory store's): the API's documents, each with a version
of its own, a count per tenant, and each schedule's marks.

Every replica reads the documents when the store's version moves on; then it compares each
document's own version to the one it holds and reads only the documents whose version
differs, never every tenant's whole list for one change (docs/schedules.md). A version is a
random token written anew with each change, never a count: a store that loses its data or
its last writes would count again to a number a replica has seen, with other documents.
"""

from __future__ import annotations

import os
from collections.abc import Collection
from dataclasses import dataclass


@dataclass(slots=True)
class Marks:
    """A schedule's marks in the store: when it was first seen, the last fire time handled
    (started or skipped) and the last that started an execution (Unix times)."""

    created: float
    handled: float | None = None
    started: float | None = None
    #: The timing (cron and zone) `handled` belongs to (roles.py `Schedules.schedule_marks`).
    timing: str | None = None


class ScheduleLimit(Exception):
    """The tenant already has `limit` schedules (`--max-schedules`): a new one is refused
    (409) and nothing changes."""

    def __init__(self, limit: int) -> None:
        super().__init__(f"the tenant has {limit} schedules already")
        self.limit = limit


def new_schedules_version() -> str:
    """A version no store state has shown (64 random bits), written with each change: the
    store's as a whole, and the changed document's own."""
    return os.urandom(8).hex()


class ScheduleDocuments:
    """The documents, their versions and the tenants' counts of one process's store."""

    def __init__(self) -> None:
        self.documents: dict[str, str] = {}
        self.versions: dict[str, str] = {}
        self.version = ""
        #: The keys each tenant's count holds ('' the key of no tenant); a document put
        #: without a limit (a declared schedule's `enabled`) is in none.
        self.counted: dict[str | None, set[str]] = {}
        self.marks: dict[str, Marks] = {}

    def put(self, key: str, document: str, tenant: str | None, limit: int | None) -> str:
        """Keep `document` under `key`; with `limit`, counted in its tenant's schedules, a new
        one refused (ScheduleLimit, nothing changed) when the tenant has `limit` already (a
        change of one kept is never refused, a document kept before the count included)."""
        if limit is not None:
            keys = self.counted.setdefault(tenant, set())
            if key not in keys and key not in self.documents and len(keys) >= limit:
                raise ScheduleLimit(limit)
            keys.add(key)
        self.documents[key] = document
        self.versions[key] = self.version = new_schedules_version()
        return self.version

    def delete(self, key: str, tenant: str | None) -> bool:
        found = self.documents.pop(key, None) is not None
        self.versions.pop(key, None)
        self.counted.get(tenant, set()).discard(key)
        self.marks.pop(key, None)
        self.version = new_schedules_version()
        return found

    def read(self, keys: Collection[str] | None) -> dict[str, str]:
        """The documents of `keys` that exist (every one when None)."""
        if keys is None:
            return dict(self.documents)
        return {key: self.documents[key] for key in keys if key in self.documents}
