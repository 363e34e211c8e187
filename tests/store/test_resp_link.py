"""The store's multiplexed Redis connection (agent_server/store/redis/resp.py) against a real
`redis-server`: replies reach their own callers under concurrency, error replies keep the
connection in step, a lost or silent Redis fails every waiting call fast, and the next call
connects again; AUTH and SELECT as the URL says."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path

import pytest
from redis.exceptions import AuthenticationError, ConnectionError, NoScriptError, ResponseError

from agent_server.store.redis.resp import Acknowledgement, RedisLink
from tests.support.redis_server import RedisServer

#: Every wait in these tests is bounded by this.
BOUND = 10.0


def link(url: str, timeout: float = 2.0) -> RedisLink:
    return RedisLink(url, connect_timeout=2.0, timeout=timeout)


async def test_concurrent_calls_each_get_their_own_reply(redis_url: str) -> None:
    redis = link(redis_url)
    try:

        async def one(n: int) -> None:
            for i in range(50):
                value = f"{n}-{i}-é"
                assert await redis.call("SET", f"k{n}", value) == "OK"
                assert await redis.call("GET", f"k{n}") == value

        async with asyncio.timeout(BOUND):
            await asyncio.gather(*(one(n) for n in range(40)))
        replies = await redis.pipeline([("INCR", "n"), ("INCR", "n"), ("GET", "n")])
        assert replies == [1, 2, "2"]
    finally:
        await redis.close()


async def test_error_replies_are_raised_and_the_connection_stays_in_step(redis_url: str) -> None:
    redis = link(redis_url)
    try:
        with pytest.raises(NoScriptError):
            await redis.call("EVALSHA", "0" * 40, 0)
        with pytest.raises(NoScriptError):  # a function Redis lacks: load, send again
            await redis.call("FCALL", "agent_server_none_0", 0)
        with pytest.raises(ResponseError, match="wrong number of arguments"):
            await redis.call("GET")
        replies = await redis.pipeline(
            [("SET", "a", "1"), ("EVALSHA", "0" * 40, 0), ("INCR", "a"), ("HGET", "a", "x")]
        )
        assert replies[0] == "OK" and replies[2] == 2
        assert isinstance(replies[1], NoScriptError)
        assert isinstance(replies[3], ResponseError) and "WRONGTYPE" in str(replies[3])
        assert await redis.call("EVAL", "return {ARGV[1], false, 3}", 0, "x") == ["x", None, 3]
    finally:
        await redis.close()


async def test_a_lost_connection_fails_waiting_calls_and_the_next_call_reconnects(
    own_redis: RedisServer,
) -> None:
    redis = link(own_redis.url)
    try:
        await redis.call("CLIENT", "SETNAME", "doomed")
        waiting = asyncio.ensure_future(redis.call("BLPOP", "nothing", 0))
        await asyncio.sleep(0)
        assert own_redis.command("CLIENT", "KILL", "SKIPME", "yes").startswith(b":")  # type: ignore[union-attr]
        async with asyncio.timeout(BOUND):
            with pytest.raises(ConnectionError):
                await waiting
        assert await redis.call("PING") == "PONG"  # connected again
        own_redis.stop()
        with pytest.raises(ConnectionError):
            await redis.call("PING")
        own_redis.start()
        assert await redis.call("PING") == "PONG"
    finally:
        await redis.close()


async def test_a_silent_redis_fails_every_waiting_call_by_the_timeout(
    own_redis: RedisServer,
) -> None:
    redis = link(own_redis.url, timeout=0.5)
    assert own_redis.proc is not None
    try:
        assert await redis.call("PING") == "PONG"
        os.kill(own_redis.proc.pid, signal.SIGSTOP)
        loop = asyncio.get_running_loop()
        began = loop.time()
        async with asyncio.timeout(BOUND):
            outcomes = await asyncio.gather(
                *(redis.call("PING") for _ in range(20)), return_exceptions=True
            )
        assert all(isinstance(outcome, ConnectionError) for outcome in outcomes), outcomes
        assert loop.time() - began < 0.5 + 1.0
        os.kill(own_redis.proc.pid, signal.SIGCONT)
        async with asyncio.timeout(BOUND):
            assert await redis.call("PING") == "PONG"
    finally:
        os.kill(own_redis.proc.pid, signal.SIGCONT)
        await redis.close()


async def test_auth_and_select_as_the_url_says(own_redis: RedisServer) -> None:
    assert own_redis.command("CONFIG", "SET", "requirepass", "s3cret") == b"+OK\r\n"
    base = f"127.0.0.1:{own_redis.port}"
    redis = link(f"redis://:s3cret@{base}/3")
    try:
        assert await redis.call("SET", "where", "db3") == "OK"
        assert await redis.call("SELECT", 0) == "OK"
        assert await redis.call("GET", "where") is None  # it was written in db 3
    finally:
        await redis.close()
    wrong = link(f"redis://:nope@{base}/0")
    with pytest.raises(AuthenticationError):
        await wrong.call("PING")
    await wrong.close()
    nobody = link(f"redis://127.0.0.1:{own_redis.port}/0")
    with pytest.raises(AuthenticationError):  # NOAUTH
        await nobody.call("GET", "x")
    await nobody.close()


async def test_a_caller_that_goes_away_leaves_the_connection_in_step(
    own_redis: RedisServer,
) -> None:
    """Calls cancelled while Redis is paused: their replies, when they come, are skipped,
    and the next callers get their own."""
    redis = link(own_redis.url, timeout=5.0)
    assert own_redis.proc is not None
    try:
        assert await redis.call("SET", "k", "before") == "OK"
        os.kill(own_redis.proc.pid, signal.SIGSTOP)
        gone = [
            asyncio.ensure_future(redis.pipeline([("GET", "k"), ("INCR", "n")])),
            asyncio.ensure_future(redis.call("GET", "k")),
        ]
        await asyncio.sleep(0.05)
        for task in gone:
            task.cancel()
        await asyncio.gather(*gone, return_exceptions=True)
        os.kill(own_redis.proc.pid, signal.SIGCONT)
        async with asyncio.timeout(BOUND):
            assert await redis.call("SET", "k", "after") == "OK"
            assert await redis.pipeline([("GET", "k"), ("GET", "n")]) == ["after", "1"]
    finally:
        os.kill(own_redis.proc.pid, signal.SIGCONT)
        await redis.close()


def test_rediss_verifies_the_server_as_the_url_says(tmp_path: Path) -> None:
    """A TLS Redis (Debian's redis-server with a `--tls-port`): verified against the CA the
    URL names, refused without it, accepted unverified with `ssl_cert_reqs=none`."""
    import subprocess
    import time

    import trustme

    from tests.support.process import free_port, need

    need("redis-server", package="redis-server")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    cert.private_key_pem.write_to_path(str(tmp_path / "key.pem"))
    cert.cert_chain_pems[0].write_to_path(str(tmp_path / "cert.pem"))
    ca.cert_pem.write_to_path(str(tmp_path / "ca.pem"))
    port = free_port()
    server = subprocess.Popen(
        [
            "redis-server",
            *("--port", "0", "--tls-port", str(port), "--bind", "127.0.0.1"),
            *("--tls-cert-file", str(tmp_path / "cert.pem")),
            *("--tls-key-file", str(tmp_path / "key.pem")),
            *("--tls-auth-clients", "no", "--save", "", "--dir", str(tmp_path)),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    async def ping(url: str) -> object:
        redis = link(url)
        try:
            return await redis.call("PING")
        finally:
            await redis.close()

    base = f"rediss://127.0.0.1:{port}/0"
    try:
        deadline = time.monotonic() + BOUND
        while True:  # until it accepts TLS connections (bounded)
            try:
                assert asyncio.run(ping(f"{base}?ssl_cert_reqs=none")) == "PONG"
                break
            except ConnectionError:
                assert server.poll() is None, "redis-server exited: built without TLS?"
                assert time.monotonic() < deadline, "the TLS Redis never answered"
                time.sleep(0.05)
        assert asyncio.run(ping(f"{base}?ssl_ca_certs={tmp_path / 'ca.pem'}")) == "PONG"
        with pytest.raises(ConnectionError, match="CERTIFICATE_VERIFY_FAILED"):
            asyncio.run(ping(base))  # the system's CAs do not know this one
    finally:
        server.kill()
        server.wait(timeout=BOUND)


async def test_a_reset_during_a_multi_reply_command_leaves_no_error_unobserved() -> None:
    """SUBSCRIBE to several channels, or the AUTH/SELECT/ROLE of a connection, waits for
    several replies; a reset fails them all at once. The first failure is raised, the others
    observed: none reaches the loop's handler as an exception nobody retrieved."""
    import gc

    from redis.exceptions import ConnectionError as RedisConnectionError

    from agent_server.store.redis.resp import _all

    loop = asyncio.get_running_loop()
    unobserved: list[dict[str, object]] = []
    loop.set_exception_handler(lambda _, context: unobserved.append(context))
    try:
        futures = [loop.create_future() for _ in range(3)]
        for future in futures:
            future.set_exception(RedisConnectionError("connection to Redis lost: reset"))
        with pytest.raises(RedisConnectionError):
            await _all(futures)
        del futures
        gc.collect()
        await asyncio.sleep(0)
    finally:
        loop.set_exception_handler(None)
    assert unobserved == []


#: A primary with no replica: each WAIT blocks its connection this long, then answers 0.
ACK_MS = 150


def acked_link(url: str) -> RedisLink:
    return RedisLink(
        url,
        connect_timeout=2.0,
        timeout=2.0,
        ack=Acknowledgement((("PUBLISH", "acked", ""), ("WAIT", 1, ACK_MS))),
    )


def waits(server: RedisServer) -> int:
    """How many WAIT commands the server has run (INFO commandstats)."""
    stats = server.command("INFO", "commandstats").decode()  # type: ignore[union-attr]
    for line in stats.splitlines():
        if line.startswith("cmdstat_wait:"):
            return int(line.split("calls=", 1)[1].split(",", 1)[0])
    return 0


async def test_acknowledged_writes_share_one_wait_at_a_time(own_redis: RedisServer) -> None:
    """Each write is answered with the WAIT sent after it on its connection; the writes of
    one moment share one, and those sent while it blocks share the next: two waves of 100
    writes cost two WAITs, not 200 (Redis runs nothing of a connection its WAIT blocks)."""
    redis = acked_link(own_redis.url)
    try:
        loop = asyncio.get_running_loop()
        began = loop.time()
        async with asyncio.timeout(BOUND):
            first = [asyncio.ensure_future(redis.call_acked("INCR", "n")) for _ in range(100)]
            await asyncio.sleep(ACK_MS / 3000)  # the first wave's WAIT blocks meanwhile
            second = [asyncio.ensure_future(redis.call_acked("INCR", "n")) for _ in range(100)]
            answers = await asyncio.gather(*first, *second)
        elapsed = loop.time() - began
        assert sorted(reply for reply, _ in answers) == list(range(1, 201))
        assert all(acked == 0 for _, acked in answers), answers  # no replica holds them
        assert waits(own_redis) == 2
        assert 2 * ACK_MS / 1000 <= elapsed < 2 * ACK_MS / 1000 + 1.0, elapsed
        assert await redis.call("GET", "n") == "200"  # the link stays in step
    finally:
        await redis.close()


async def test_an_acknowledgement_lost_with_its_connection_is_an_error_not_a_yes(
    own_redis: RedisServer,
) -> None:
    """The write's reply came, its WAIT's did not (the connection went): the caller gets the
    reply and the error, never a count; the next write connects again."""
    redis = acked_link(own_redis.url)
    try:
        await redis.call("CLIENT", "SETNAME", "doomed")
        pending = asyncio.ensure_future(redis.call_acked("SET", "k", "v"))
        for _ in range(round(BOUND / 0.01)):  # until its WAIT blocks the connection
            if waits(own_redis):
                break
            await asyncio.sleep(0.01)
        assert own_redis.command("CLIENT", "KILL", "SKIPME", "yes").startswith(b":")  # type: ignore[union-attr]
        async with asyncio.timeout(BOUND):
            reply, acked = await pending
        assert reply == "OK" and isinstance(acked, ConnectionError), acked
        async with asyncio.timeout(BOUND):
            assert await redis.call_acked("GET", "k") == ("v", 0)
    finally:
        await redis.close()


@pytest.mark.parametrize("loop_kind", ["asyncio", "uvloop"])
def test_a_reply_that_came_while_this_process_was_busy_is_not_late(
    redis_url: str, loop_kind: str
) -> None:
    """A command's timeout is Redis's silence, not this process's: a loop turn that holds
    the loop past the timeout (a drain ending 100,000 executions in one turn) must find the
    replies that arrived meanwhile, not drop the connection before reading them (uvloop
    runs its timers before it polls for input)."""
    import time

    import uvloop

    async def main() -> None:
        redis = link(redis_url, timeout=0.3)
        try:
            assert await redis.call("PING") == "PONG"
            sent = [asyncio.ensure_future(redis.call("INCR", "busy")) for _ in range(3)]
            await asyncio.sleep(0)  # sent: they leave at the end of this turn
            await asyncio.sleep(0)
            time.sleep(0.9)  # noqa: ASYNC251 - the loop held three times the timeout
            async with asyncio.timeout(BOUND):
                assert sorted(await asyncio.gather(*sent)) == [1, 2, 3]
            assert await redis.call("GET", "busy") == "3"
        finally:
            await redis.close()

    factory = uvloop.new_event_loop if loop_kind == "uvloop" else asyncio.new_event_loop
    with asyncio.Runner(loop_factory=factory) as runner:
        runner.run(main())
