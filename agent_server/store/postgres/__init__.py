"""The execution store shared by every replica through one PostgreSQL database (DESIGN
section 26, docs/postgres.md).

One concept per module: `store.py` holds `PostgresStore`, which composes the rest (and keeps
the replica's liveness, the verdict on dead owners, notices and retention); `records.py`
creates, reads, lists, sessions, releases, cancels and schedules; `owner.py` the owner's
outbox, claims, checkpoints and requests for input; `link.py` the connection pool and
whether Postgres is up; `codec.py` records to and from rows, derived from
agent_server/model/record.py; `schema.py` the versioned migrations in `migrations/`.
"""

from __future__ import annotations

from agent_server.store.base import SchemaTooNew
from agent_server.store.postgres.codec import describe_url, is_postgres_url
from agent_server.store.postgres.schema import migrate_url
from agent_server.store.postgres.store import PostgresStore

__all__ = ["PostgresStore", "SchemaTooNew", "describe_url", "is_postgres_url", "migrate_url"]
