"""Where a JWT's verifying key comes from: the files read at start, or an identity
provider's JWKS fetched over HTTP and cached.

The JWKS is fetched with httpx's async client (never blocking the loop), bounded in time
(`FETCH_TIMEOUT`, the whole exchange) and size (`MAX_JWKS_BYTES`), one fetch at a time for
every request waiting on it. An unknown `kid` fetches it again at once, but never sooner than
`MIN_REFRESH_INTERVAL` after the last attempt, so a stream of forged kids costs the provider
one request per interval; a known key is served from the cache, which is refreshed in the
background once older than `MAX_AGE`. A fetch that fails keeps the keys fetched before and
logs one WARNING line naming the provider's host, never a token.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Sequence
from typing import Protocol

import httpx

from agent_server.identity.jwt_keys import KeyFileError, VerifyingKey, parse_jwks
from agent_server.model.counts import counted
from agent_server.model.redaction import shown_url

logger = logging.getLogger("agent_server.auth")

#: Seconds one JWKS fetch may take, connection to last byte.
FETCH_TIMEOUT = 5.0
#: Largest JWKS document read; a larger one is a failed fetch.
MAX_JWKS_BYTES = 1024 * 1024
#: Seconds between two fetches at least, whatever the tokens ask for (docs/security.md).
MIN_REFRESH_INTERVAL = 10.0
#: Seconds a fetched key set is used before it is fetched again in the background.
MAX_AGE = 300.0


class KeySource(Protocol):
    """The keys a token with header `kid` may have been signed with."""

    async def candidates(self, kid: str | None) -> Sequence[VerifyingKey]: ...


def matching(keys: Sequence[VerifyingKey], kid: str | None) -> list[VerifyingKey]:
    """The keys named `kid`; a token naming none is tried only against a set of one key (no
    token may make the server try every key); a key without a kid of its own (a PEM file)
    matches any kid."""
    if kid is None:
        return list(keys) if len(keys) == 1 else []
    named = [key for key in keys if key.kid == kid]
    return named or [key for key in keys if key.kid is None]


class StaticKeys:
    """The keys of `--jwt-public-key-file` or `--jwt-secret-file`, read at start."""

    def __init__(self, keys: Sequence[VerifyingKey]) -> None:
        self.keys = tuple(keys)

    async def candidates(self, kid: str | None) -> Sequence[VerifyingKey]:
        return matching(self.keys, kid)


class _FetchFailed(Exception):
    """Why a fetch gave no key set; its message names no token and no URL path."""


class RemoteJwks:
    """The key set `--jwt-jwks-url` serves, cached."""

    def __init__(self, url: str) -> None:
        self.url = url
        self.keys: tuple[VerifyingKey, ...] = ()
        self._fetched_at: float | None = None  # monotonic time of the last good fetch
        self._attempted_at: float | None = None  # of the last attempt, good or not
        self._fetch: asyncio.Task[None] | None = None

    async def candidates(self, kid: str | None) -> Sequence[VerifyingKey]:
        now = time.monotonic()
        if self._fetched_at is None:
            await self._refresh(now)
        elif now - self._fetched_at > MAX_AGE:
            self._start_refresh(now)  # the cached keys answer meanwhile
        found = matching(self.keys, kid)
        if not found and kid is not None:
            # A key rotated in at the provider since the last fetch: fetch again at once.
            await self._refresh(now)
            found = matching(self.keys, kid)
        return found

    async def _refresh(self, now: float) -> None:
        task = self._start_refresh(now)
        if task is not None:
            # Shielded: a request that goes away does not cancel the fetch others wait on.
            await asyncio.shield(task)

    def _start_refresh(self, now: float) -> asyncio.Task[None] | None:
        """The fetch under way, or a new one unless the last began under
        MIN_REFRESH_INTERVAL ago."""
        if self._fetch is not None and not self._fetch.done():
            return self._fetch
        if self._attempted_at is not None and now - self._attempted_at < MIN_REFRESH_INTERVAL:
            return None
        self._attempted_at = now
        self._fetch = asyncio.get_running_loop().create_task(self._fetch_keys())
        return self._fetch

    async def _fetch_keys(self) -> None:
        """Fetch and keep the key set; never raises (a failure is one WARNING line)."""
        try:
            keys = await self._download()
        except Exception as exc:
            reason = str(exc) if isinstance(exc, _FetchFailed) else type(exc).__name__
            logger.warning(
                "JWKS from %s could not be fetched (%s); keeping the %s fetched before",
                shown_url(self.url),
                reason,
                counted(len(self.keys), "key"),
            )
            return
        self.keys = tuple(keys)
        self._fetched_at = time.monotonic()
        logger.info(
            "JWKS from %s holds %s", shown_url(self.url), counted(len(keys), "signature key")
        )

    async def _download(self) -> list[VerifyingKey]:
        client = httpx.AsyncClient(timeout=FETCH_TIMEOUT, follow_redirects=False)
        async with (
            asyncio.timeout(FETCH_TIMEOUT),
            client,
            client.stream("GET", self.url, headers={"Accept": "application/json"}) as response,
        ):
            if response.status_code != 200:
                raise _FetchFailed(f"status {response.status_code}")
            body = bytearray()
            async for chunk in response.aiter_bytes():
                body += chunk
                if len(body) > MAX_JWKS_BYTES:
                    raise _FetchFailed(f"larger than {MAX_JWKS_BYTES} bytes")
        try:
            document = json.loads(bytes(body))
        except ValueError:
            raise _FetchFailed("not JSON") from None
        try:
            keys = parse_jwks(document, "the JWKS")
        except KeyFileError as exc:
            raise _FetchFailed(str(exc)) from None
        if not keys:
            raise _FetchFailed("no signature key in it")
        return keys
