"""The execution store shared by every replica through one PostgreSQL database (DESIGN
section 26, docs/postgres.md).

One concept per module: `store.py` holds `PostgresStore`, composed of the rest (and keeping
the replica's liveness, the notices it listens for and retention): plain parts its
`__init__` makes, each given what it uses, and one part per role of the interface
(`records.py`, `claims.py`, `inputs.py`, `reads.py`, `webhooks.py`, `schedules.py`), which
`ComposedStore` (store/composed.py) forwards the role's calls to; `coalesce.py` the
statement the calls made together share (plain creates, reads); `owner.py` the owner's
outbox and checkpoints; `repair.py` the verdicts on held rows nobody runs;
`notices.py` who waits on what; `rows.py` the row helpers every part writes with; `link.py`
the connection pool and whether Postgres is up; `codec.py` records to and from rows, derived
from agent_server/model/record.py; `schema.py` the versioned migrations in `migrations/`.
"""

from __future__ import annotations

from agent_server.store.base import SchemaTooNew
from agent_server.store.postgres.codec import describe_url, is_postgres_url
from agent_server.store.postgres.schema import migrate_url
from agent_server.store.postgres.store import PostgresStore

__all__ = ["PostgresStore", "SchemaTooNew", "describe_url", "is_postgres_url", "migrate_url"]
