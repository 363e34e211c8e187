"""Schedules' documents and their marks in rows (each firing marked once across replicas);
the `Schedules` part of `PostgresStore`."""

from __future__ import annotations

from collections.abc import Collection

from agent_server.store import roles
from agent_server.store.base import Marks, ScheduleLimit, new_schedules_version
from agent_server.store.postgres.link import Conn, Link


class Schedules(roles.Schedules):
    """Schedules and their marks of `PostgresStore`."""

    def __init__(self, link: Link, agent: str) -> None:
        self._link = link
        self._agent = agent

    async def schedule_marks(self, schedule_key: str, now: float, timing: str = "") -> Marks:
        """One transaction on the schedule's row (locked): first seen now, or as kept, with
        a changed timing moving `handled` on to now."""
        async with self._link.tx("schedule_marks") as conn:
            await conn.execute(
                "INSERT INTO schedule_marks (agent, key, created) VALUES (%s, %s, %s)"
                " ON CONFLICT DO NOTHING",
                (self._agent, schedule_key, now),
            )
            cursor = await conn.execute(
                "SELECT created, handled, started, timing FROM schedule_marks"
                " WHERE agent = %s AND key = %s FOR UPDATE",
                (self._agent, schedule_key),
            )
            row = await cursor.fetchone()
            assert row is not None
            created, handled, started, kept = row
            if timing and kept != timing:
                if kept is not None:
                    handled = now if handled is None else max(handled, now)
                await conn.execute(
                    "UPDATE schedule_marks SET handled = %s, timing = %s"
                    " WHERE agent = %s AND key = %s",
                    (handled, timing, self._agent, schedule_key),
                )
        return Marks(created, handled, started)

    async def schedule_fired(
        self,
        schedule_key: str,
        at: float,
        started: bool,
        *,
        handled: bool = True,
        timing: str = "",
    ) -> None:
        """Each mark the later of `at` and the one kept: a mark never goes back."""
        async with self._link.tx("schedule_fired") as conn:
            await conn.execute(
                "INSERT INTO schedule_marks AS m (agent, key, created, handled, started, timing)"
                " VALUES (%(agent)s, %(key)s, %(at)s, CASE WHEN %(h)s THEN %(at)s END,"
                " CASE WHEN %(s)s THEN %(at)s END, nullif(%(timing)s, ''))"
                " ON CONFLICT (agent, key) DO UPDATE SET"
                " handled = CASE WHEN %(h)s THEN greatest(m.handled, %(at)s) ELSE m.handled END,"
                " started = CASE WHEN %(s)s THEN greatest(m.started, %(at)s) ELSE m.started END,"
                " timing = coalesce(nullif(%(timing)s, ''), m.timing)",
                {"agent": self._agent, "key": schedule_key, "at": at, "h": handled,
                 "s": started, "timing": timing},
            )  # fmt: skip

    async def put_schedule(
        self,
        schedule_key: str,
        document: str,
        *,
        tenant: str | None = None,
        limit: int | None = None,
    ) -> str:
        """One transaction: with `limit`, the tenant's count under a lock of its own (two
        replicas making the last one at once make one), then the document, its version and
        the store's. A change of one kept is never refused."""
        version = new_schedules_version()
        async with self._link.tx("schedules") as conn:
            if limit is not None:
                await conn.execute(
                    "SELECT pg_advisory_xact_lock(hashtextextended(%s, 0))",
                    (f"schedules|{self._agent}|{tenant}",),
                )
                cursor = await conn.execute(
                    "SELECT (SELECT count(*) FROM schedules WHERE agent = %(agent)s AND counted"
                    " AND tenant IS NOT DISTINCT FROM %(tenant)s),"
                    " EXISTS (SELECT 1 FROM schedules WHERE agent = %(agent)s AND key = %(key)s)",
                    {"agent": self._agent, "tenant": tenant, "key": schedule_key},
                )
                row = await cursor.fetchone()
                assert row is not None
                if not row[1] and int(row[0]) >= limit:
                    raise ScheduleLimit(limit)
            await conn.execute(
                "INSERT INTO schedules (agent, key, document, version, tenant, counted)"
                " VALUES (%s, %s, %s, %s, %s, %s)"
                " ON CONFLICT (agent, key) DO UPDATE SET document = excluded.document,"
                " version = excluded.version,"
                " tenant = CASE WHEN excluded.counted THEN excluded.tenant"
                " ELSE schedules.tenant END,"
                " counted = schedules.counted OR excluded.counted",
                (self._agent, schedule_key, document, version, tenant, limit is not None),
            )
            await self._new_version(conn, version)
        return version

    async def delete_schedule(self, schedule_key: str, tenant: str | None = None) -> bool:
        async with self._link.tx("schedules") as conn:
            cursor = await conn.execute(
                "DELETE FROM schedules WHERE agent = %s AND key = %s RETURNING 1",
                (self._agent, schedule_key),
            )
            found = await cursor.fetchone() is not None
            await conn.execute(
                "DELETE FROM schedule_marks WHERE agent = %s AND key = %s",
                (self._agent, schedule_key),
            )
            await self._new_version(conn, new_schedules_version())
        return found

    async def _new_version(self, conn: Conn, version: str) -> None:
        await conn.execute(
            "INSERT INTO schedules_version (agent, version) VALUES (%s, %s)"
            " ON CONFLICT (agent) DO UPDATE SET version = excluded.version",
            (self._agent, version),
        )

    async def schedules_version(self) -> str:
        async with self._link.tx("schedules") as conn:
            cursor = await conn.execute(
                "SELECT version FROM schedules_version WHERE agent = %s", (self._agent,)
            )
            row = await cursor.fetchone()
        return "" if row is None else str(row[0])

    async def schedule_versions(self) -> dict[str, str]:
        async with self._link.tx("schedules") as conn:
            cursor = await conn.execute(
                "SELECT key, version FROM schedules WHERE agent = %s", (self._agent,)
            )
            return {str(key): str(version) for key, version in await cursor.fetchall()}

    async def schedule_documents(self, keys: Collection[str] | None = None) -> dict[str, str]:
        """The documents of `keys` that exist (every one when None)."""
        async with self._link.tx("schedules") as conn:
            if keys is None:
                cursor = await conn.execute(
                    "SELECT key, document FROM schedules WHERE agent = %s", (self._agent,)
                )
            else:
                cursor = await conn.execute(
                    "SELECT key, document FROM schedules WHERE agent = %s AND key = ANY(%s)",
                    (self._agent, list(keys)),
                )
            return {str(key): str(document) for key, document in await cursor.fetchall()}
