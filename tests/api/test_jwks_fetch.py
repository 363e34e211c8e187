"""The JWKS cache against a real endpoint on loopback: one fetch for many requests waiting
on it, an unknown kid fetching again no sooner than the interval, and a provider that stalls
or answers too much bounded in time and size, said in one WARNING line, never a hang."""

from __future__ import annotations

import asyncio
import logging
import time

import pytest

from agent_server.identity import jwks
from agent_server.identity.jwks import RemoteJwks
from tests.support.identity import JwksServer, Provider


async def test_requests_waiting_on_the_key_set_share_one_fetch() -> None:
    provider = Provider()
    with JwksServer(provider.jwks("rsa-1", "ec-1")) as idp:
        idp.stall = 0.3  # they all arrive while the first fetch is under way
        keys = RemoteJwks(idp.url)
        found = await asyncio.gather(*(keys.candidates("rsa-1") for _ in range(50)))
        assert all(len(each) == 1 for each in found)
        assert idp.fetches == 1
        # Unknown kids: one fetch at most per interval, however many ask.
        unknown = await asyncio.gather(*(keys.candidates(f"forged-{n}") for n in range(50)))
        assert all(each == [] for each in unknown)
        assert idp.fetches == 1  # the last fetch began under MIN_REFRESH_INTERVAL ago


async def test_an_unknown_kid_fetches_again_once_the_interval_is_over(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(jwks, "MIN_REFRESH_INTERVAL", 1.5)
    provider = Provider()
    with JwksServer(provider.jwks("rsa-1")) as idp:
        keys = RemoteJwks(idp.url)
        assert await keys.candidates("ec-1") == []
        idp.document = provider.jwks("rsa-1", "ec-1")
        assert await keys.candidates("ec-1") == []  # too soon
        await asyncio.sleep(1.6)  # the interval under test, shortened
        assert [key.kid for key in await keys.candidates("ec-1")] == ["ec-1"]
        assert idp.fetches == 2


@pytest.mark.parametrize(
    ("trouble", "reason"),
    [("stall", "TimeoutError"), ("padding", "larger than"), ("down", "status 503")],
)
async def test_a_provider_in_trouble_is_bounded_and_said(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture, trouble: str, reason: str
) -> None:
    monkeypatch.setattr(jwks, "FETCH_TIMEOUT", 0.5)
    monkeypatch.setattr(jwks, "MAX_JWKS_BYTES", 64 * 1024)
    provider = Provider()
    with JwksServer(provider.jwks("rsa-1")) as idp:
        if trouble == "stall":
            idp.stall = 5.0
        elif trouble == "padding":
            idp.padding = 200 * 1024
        else:
            idp.down = True
        keys = RemoteJwks(idp.url)
        started = time.monotonic()
        with caplog.at_level(logging.WARNING, logger="agent_server.auth"):
            assert await keys.candidates("rsa-1") == []
        assert time.monotonic() - started < 2.0
        said = [r.getMessage() for r in caplog.records if "could not be fetched" in r.message]
        assert len(said) == 1 and reason in said[0], caplog.text
        assert "/.well-known" not in said[0]  # the URL's path is not shown
