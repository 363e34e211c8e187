"""Session releases across replicas: one holds the session, the others join it and read its
answer, so a session is released once whichever replica is asked."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Awaitable
from typing import Any, cast

from agent_server.model.ids import new_execution_id
from agent_server.store.base import StoreUnavailable
from agent_server.store.redis import codec
from agent_server.store.redis.keys import Keys
from agent_server.store.redis.link import Link

#: How often a release that joined another replica's reads its answer.
RELEASE_POLL = 0.05
#: How long a release with no deadline holds its session (the releasing replica may die).
RELEASE_HOLD_SECONDS = 24 * 3600.0


class Releases:
    """The releases this replica holds, and the reads of others' answers."""

    __slots__ = ("_keys", "_link", "_ongoing")

    def __init__(self, link: Link, keys: Keys) -> None:
        self._link = link
        self._keys = keys
        #: The id of each release this replica has under way, by session.
        self._ongoing: dict[str, str] = {}

    async def begin(self, session_id: str, seconds: float | None) -> str | None:
        """One SET NX with an expiry (a replica dying mid-release does not hold the session
        for ever), holding this release's id; when another replica's release holds it, its
        id (a second round trip)."""
        hold = RELEASE_HOLD_SECONDS if seconds is None else seconds
        release_id = new_execution_id()
        key = self._keys.releasing(session_id)
        redis = self._link.redis
        with self._link.operation("begin_release"):
            began = await cast(
                Awaitable[Any], redis.set(key, release_id, px=max(1, round(hold * 1000)), nx=True)
            )
            other = None if began else await cast(Awaitable[Any], redis.get(key))
        if began or not other:
            if not began:  # it ended between the two commands: begin again
                return await self.begin(session_id, seconds)
            self._ongoing[session_id] = release_id
            return None
        return str(other)

    async def end(self, session_id: str, answer: dict[str, Any] | None = None) -> None:
        """Publish the answer for the releases that joined this one (kept a minute), then
        free the session: one script."""
        release_id = self._ongoing.pop(session_id, "")
        with self._link.operation("end_release"):
            _, held = await self._link.told(
                "end_release",
                self._keys.script.for_end_release(session_id, release_id),
                release_id,
                codec.dumps(answer) if answer else "",
            )
        if not held:  # a failover could leave the session held: the client asks again
            raise StoreUnavailable(f"the release of session {session_id} is not yet on a replica")

    async def shared(self, release_id: str, timeout: float) -> dict[str, Any] | None:
        """Read the other release's answer every RELEASE_POLL seconds until `timeout`."""
        deadline = time.monotonic() + timeout
        while True:
            with self._link.operation("shared_release"):
                found = await cast(
                    Awaitable[Any], self._link.redis.get(self._keys.released(release_id))
                )
            if found:
                answer: dict[str, Any] = codec.loads(found)
                return answer
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                return None
            await asyncio.sleep(min(RELEASE_POLL, remaining))
