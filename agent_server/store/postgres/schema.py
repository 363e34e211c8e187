"""The store's schema: versioned migrations shipped in the package, applied in order.

`migrations/NNNN_name.sql`, each applied once in a transaction of its own under an advisory
lock (replicas starting together wait for one another), recorded in `agent_server_schema`.
A start on an empty database applies them all; `agent-server store migrate URL` applies what
is missing and says so; a database whose schema is newer than this code is refused
(SchemaTooNew: the start stops with one line, exit 2) rather than written in a shape this
code does not know.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

import psycopg

from agent_server.store.base import SchemaTooNew

#: The advisory lock migrations are applied under (any constant shared by every version).
MIGRATION_LOCK = 0x61_67_65_6E_74_2D_73  # "agent-s"
_NAME = re.compile(r"^(\d{4})_[a-z0-9_]+\.sql$")


@dataclass(frozen=True)
class Migration:
    version: int
    name: str
    sql: str


def migrations() -> list[Migration]:
    """Every migration shipped with this package, in order."""
    found = []
    for entry in resources.files("agent_server.store.postgres.migrations").iterdir():
        match = _NAME.match(entry.name)
        if match is not None:
            found.append(Migration(int(match.group(1)), entry.name, entry.read_text("utf-8")))
    found.sort(key=lambda m: m.version)
    return found


def latest() -> int:
    return migrations()[-1].version


async def migrate(conn: psycopg.AsyncConnection[object]) -> list[Migration]:
    """Apply what is missing (on an autocommit connection); the migrations applied. Raises
    SchemaTooNew when the database holds a version this code does not have."""
    known = migrations()
    applied: list[Migration] = []
    async with conn.transaction():
        await conn.execute("SELECT pg_advisory_xact_lock(%s)", (MIGRATION_LOCK,))
        await conn.execute(
            "CREATE TABLE IF NOT EXISTS agent_server_schema ("
            " version integer PRIMARY KEY, name text NOT NULL,"
            " applied_at timestamptz NOT NULL DEFAULT now())"
        )
        cursor = await conn.execute("SELECT coalesce(max(version), 0) FROM agent_server_schema")
        row = await cursor.fetchone()
        current = int(row[0]) if row else 0  # type: ignore[index]
        newest = known[-1].version
        if current > newest:
            raise SchemaTooNew(
                f"the database's schema is version {current}, newer than this agent-server's "
                f"({newest}): run the newer release, or a database of this one"
            )
        for migration in known:
            if migration.version <= current:
                continue
            await conn.execute(migration.sql.encode())
            await conn.execute(
                "INSERT INTO agent_server_schema (version, name) VALUES (%s, %s)",
                (migration.version, migration.name),
            )
            applied.append(migration)
    return applied


async def migrate_url(url: str, connect_timeout: float = 10.0) -> list[Migration]:
    """Connect to `url` and apply what is missing (the `store migrate` command)."""
    conn = await psycopg.AsyncConnection.connect(
        url, autocommit=True, connect_timeout=max(1, round(connect_timeout))
    )
    async with conn:
        return await migrate(conn)
