"""The Redis under the fault harness's replicas (tests/support/faults/), and its faults.

Either one `redis-server` with AOF (`PlainRedis`), or a primary and two replicas, each with
AOF, watched by three real `redis-sentinel` processes (`SentinelRedis`), which the replicas
reach with `--store redis+sentinel://...`: with one node down, a replica still holds each
told write, as in a production Sentinel deployment. Either way every connection
of the replicas goes through a `CutProxy` of this process, so a cut parts the replicas from
Redis (the sentinels and the nodes) while Redis's own links (replication, the sentinels'
pings) go on, as a partition between pods and Redis does. The sentinels name the nodes by
their real ports; the proxies in front of the sentinels rewrite those ports in their replies
to the ports of the nodes' proxies, so the replicas follow a failover through the proxies too.

The nemesis pauses or restarts any one node (the primary or a replica, by the schedule's
seeded index), kills the current primary (whichever node the sentinels name) with SIGKILL
(the sentinels promote a replica; the killed node comes back as a replica of the new
primary), asks for a planned failover (`SENTINEL FAILOVER`), or does both in turn (a
failback: the killed primary restarted as it was, converted by the sentinels, then failed
over to). Each of those (and, with one replica, a restart or a pause of a node) leaves a
replica the sentinels could promote out of sync with the primary for a while, or none in
sync, in which no told write can be acknowledged (it waits for every such replica):
`SentinelRedis.watch_replication` says when such a span begins and ends, as it sees it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import signal
import socket
import struct
import subprocess
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from tests.support.redis_server import AOF, START_TIMEOUT, RedisServer
from tests.support.sentinel import SentinelProcess

# -- ports ------------------------------------------------------------------------------------

_handed_out: set[int] = set()
_ports_lock = threading.Lock()


def stable_port() -> int:
    """A free loopback port below the kernel's ephemeral range, for a part that is restarted
    on its port: no outgoing connection can take it as its local port while the part is
    down, as one could with a port 0 bound (those come from the ephemeral range)."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    chooser = random.SystemRandom()
    with _ports_lock:
        for _ in range(1000):
            port = chooser.randrange(10000, max(10001, low - 1))
            if port in _handed_out:
                continue
            with socket.socket() as sock:
                try:
                    sock.bind(("127.0.0.1", port))
                except OSError:
                    continue
            _handed_out.add(port)
            return port
    raise AssertionError("no free port below the ephemeral range")


# -- the parts --------------------------------------------------------------------------------


class AofRedis(RedisServer):
    """`redis-server --appendonly yes --appendfsync everysec` on its own directory: a restart
    (SIGTERM, then a start on the same directory and port) reloads the AOF."""

    persistence = AOF

    def send(self, sig: int) -> None:
        assert self.proc is not None
        os.kill(self.proc.pid, sig)

    def restart(self) -> int | None:
        """SIGTERM (Redis fsyncs its AOF and exits), wait for the exit, start again; the exit
        code, or None if it had to be killed."""
        assert self.proc is not None
        self.proc.terminate()
        code: int | None
        try:
            code = self.proc.wait(timeout=START_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
            code = None
        self.proc = None
        self.start()
        return code


def _bulk(text: str) -> bytes:
    return b"$%d\r\n%s\r\n" % (len(text), text.encode())


def _reset(writer: asyncio.StreamWriter) -> None:
    """Close with a reset (RST), as a cut network or a dead peer does."""
    sock = writer.get_extra_info("socket")
    if sock is not None:
        with contextlib.suppress(OSError):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    writer.transport.abort()


class CutProxy:
    """A TCP proxy on loopback between the replicas and Redis, on its own event loop in a
    thread of this process. `cut("refuse")` resets every connection and stops listening
    (connections are refused); `cut("reset")` resets every connection and resets each new
    one as soon as it is accepted; `restore()` accepts and forwards again. `stall(marker,
    seconds, times)` holds every reply from Redis that carries `marker` (or the first
    `times`) for `seconds` (one slow command: its connection stalls, the others flow).
    `rewrite` maps ports to others in the replies (a sentinel's, naming nodes: each port a
    RESP bulk string of its own)."""

    def __init__(self, target_port: int, rewrite: Mapping[int, int] | None = None) -> None:
        self.target_port = target_port
        self._rewrite = [(_bulk(str(old)), _bulk(str(new))) for old, new in (rewrite or {}).items()]
        self.port = stable_port()
        self.mode = "open"
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(target=self._loop.run_forever, name="cut-proxy")
        self._server: asyncio.AbstractServer | None = None
        self._open: set[asyncio.StreamWriter] = set()
        self._stall: tuple[tuple[bytes, ...], float] | None = None
        self._stalls: int | None = None
        #: How many replies were held (read from the test's thread).
        self.stalled = 0

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def _call(self, coroutine: Any, timeout: float = 5.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout)

    def start(self) -> None:
        self._thread.start()
        self._call(self._listen())

    async def _listen(self) -> None:
        if self._server is None:
            self._server = await asyncio.start_server(
                self._accept, "127.0.0.1", self.port, reuse_address=True
            )

    async def _accept(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        if self.mode != "open":
            _reset(writer)
            return
        try:
            up_reader, up_writer = await asyncio.wait_for(
                asyncio.open_connection("127.0.0.1", self.target_port), 2.0
            )
        except (OSError, TimeoutError):
            _reset(writer)
            return
        if self.mode != "open":  # cut while connecting
            _reset(writer)
            _reset(up_writer)
            return
        self._open.update((writer, up_writer))
        pumps = [
            asyncio.ensure_future(self._pump(reader, up_writer)),
            asyncio.ensure_future(self._pump(up_reader, writer, replies=True)),
        ]
        try:
            await asyncio.wait(pumps, return_when=asyncio.FIRST_COMPLETED)
        finally:
            for pump in pumps:
                pump.cancel()
            await asyncio.gather(*pumps, return_exceptions=True)
            for end in (writer, up_writer):
                self._open.discard(end)
                end.transport.abort()

    async def _pump(
        self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, replies: bool = False
    ) -> None:
        with contextlib.suppress(OSError):
            while data := await reader.read(65536):
                stall = self._stall
                if replies and stall is not None and any(m in data for m in stall[0]):
                    self.stalled += 1
                    if self._stalls is not None:
                        self._stalls -= 1
                        if self._stalls <= 0:
                            self._stall = None
                    await asyncio.sleep(stall[1])  # the fault itself: a slow reply
                if replies:
                    for old, new in self._rewrite:
                        data = data.replace(old, new)
                writer.write(data)
                await writer.drain()

    def stall(
        self, marker: bytes | tuple[bytes, ...], seconds: float, times: int | None = None
    ) -> None:
        """Hold the replies carrying `marker` (or any of several; the first `times` of
        them, or all)."""
        self._stalls = times
        self._stall = ((marker,) if isinstance(marker, bytes) else marker, seconds)

    def unstall(self) -> None:
        """Hold no more replies (those held now go on when their time is up)."""
        self._stall = None

    def cut(self, mode: str) -> None:
        self._call(self._cut(mode))

    async def _cut(self, mode: str) -> None:
        self.mode = mode
        if mode == "refuse" and self._server is not None:
            self._server.close()
            self._server = None
        for end in list(self._open):
            _reset(end)
        self._open.clear()

    def restore(self) -> None:
        self._call(self._restore())

    async def _restore(self) -> None:
        self.mode = "open"
        await self._listen()

    async def _close(self) -> None:
        """Refuse and reset everything, then end every connection's task (owned to the
        end: none is left for the closed loop to find unfinished)."""
        await self._cut("refuse")
        tasks = [task for task in asyncio.all_tasks() if task is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)

    def stop(self) -> None:
        if not self._thread.is_alive():
            return
        with contextlib.suppress(Exception):
            self._call(self._close())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=5)
        if not self._thread.is_alive():
            self._loop.close()


# -- the Redis the replicas use ---------------------------------------------------------------

#: The Sentinel service the nodes are known by.
SERVICE = "faults"
#: A primary silent this long (ms) is failed over: longer than the nemesis pauses it (at
#: most 4 s), so a pause stays a pause and the failovers are the schedule's own.
DOWN_AFTER_MS = 5000
FAILOVER_TIMEOUT_MS = 5000
#: Bound on the sentinels naming a new primary after a kill or a planned failover (seconds).
FAILOVER_WAIT = 20.0
#: Bound on a node and the sentinels agreeing after a start, a restart or a heal (seconds).
SETTLE_WAIT = 30.0
#: Seconds a settle leaves the sentinels to turn a deposed primary (back from a pause, or
#: left up by `SENTINEL FAILOVER`) into a replica before doing it itself. They take about
#: ten; doing it sooner races their own reconfiguration, which then undoes the promotion of
#: the next failover (seen: `-failover-abort-slave-timeout`).
NUDGE_AFTER = 15.0


def _wait(predicate: Callable[[], Any], timeout: float) -> Any:
    """Poll `predicate` until it is truthy or `timeout` passed; its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.05)


class Node(AofRedis):
    """A data node with AOF, started as a replica of `replica_of` when that is set."""

    def __init__(self, directory: Path, port: int | None = None) -> None:
        super().__init__(directory, port)
        self.replica_of: int | None = None

    @property  # type: ignore[override]
    def persistence(self) -> tuple[str, ...]:
        if self.replica_of is None:
            return AOF
        return (*AOF, "--replicaof", "127.0.0.1", str(self.replica_of))

    def role(self) -> tuple[str, int | None, str]:
        """(`master` or `slave`, the primary's port, the link's state), from ROLE; ("", ...)
        when it does not answer."""
        reply = self.command("ROLE")
        parts = (reply or b"").decode(errors="replace").split("\r\n")
        if len(parts) < 3:
            return "", None, ""
        if parts[2] == "slave" and len(parts) >= 8:
            return "slave", int(parts[5][1:]), parts[7]
        return parts[2], None, ""

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


class PlainRedis:
    """One `redis-server` with AOF behind one proxy: `--store redis://...`."""

    kinds: tuple[str, ...] = ("pause-redis", "restart-redis", "cut")

    def __init__(self, directory: Path) -> None:
        (directory / "redis").mkdir()
        self.node = Node(directory / "redis", port=stable_port())
        self.proxy = CutProxy(self.node.port)

    def open(self) -> None:
        self.node.start()
        self.proxy.start()

    @property
    def url(self) -> str:
        return self.proxy.url

    def primary(self) -> Node:
        return self.node

    def pick(self, index: int) -> tuple[Node, str]:
        """The node a pause or a restart hits (the one there is), and how to name it."""
        del index
        return self.node, f":{self.node.port}"

    def cut(self, mode: str) -> None:
        self.proxy.cut(mode)

    def restore(self) -> None:
        self.proxy.restore()

    def restart(self, index: int) -> str:
        del index
        return f"exit {self.node.restart()}"

    def settle(self, timeout: float = SETTLE_WAIT) -> str | None:
        del timeout
        return None

    def heal(self) -> str | None:
        if not self.node.running():
            self.node.start()
        else:
            self.node.send(signal.SIGCONT)
        self.proxy.restore()
        return None

    def describe(self) -> str:
        return f"redis-server :{self.node.port}"

    def close(self) -> None:
        self.proxy.stop()
        if self.node.running():
            with contextlib.suppress(OSError):
                self.node.send(signal.SIGCONT)
        self.node.kill()


def start_sentinel(directory: Path, primary: int) -> SentinelProcess:
    """A sentinel of the harness: on a port kept for it, quorum 2, its own timings."""
    return SentinelProcess(
        directory,
        primary,
        service=SERVICE,
        port=stable_port(),
        down_after_ms=DOWN_AFTER_MS,
        failover_timeout_ms=FAILOVER_TIMEOUT_MS,
    )


def port_of(address: tuple[str, int] | None) -> int | None:
    return None if address is None else address[1]


#: Seconds between two looks of the watch of whether a replica is in sync with the primary.
REPLICATION_POLL = 0.1

#: Redis replicas under Sentinel by default: two, as in production, so that with any one node
#: down (killed, paused, restarting, resyncing) a replica still acknowledges told writes.
REDIS_REPLICAS = 2


class SentinelRedis:
    """A primary and `replicas` replicas (AOF each; two by default), three sentinels (quorum
    2), a proxy in front of each: `--store redis+sentinel://<the sentinels' proxies>/faults/0`."""

    kinds: tuple[str, ...] = (
        "pause-redis",
        "restart-redis",
        "cut",
        "failover",
        "kill-primary",
        "failback",
    )

    def __init__(self, directory: Path, replicas: int = REDIS_REPLICAS) -> None:
        assert replicas >= 1, "Sentinel needs a replica to promote"
        for index in range(1 + replicas):
            (directory / f"redis{index}").mkdir()
        self.directory = directory
        self.nodes = [
            Node(directory / f"redis{i}", port=stable_port()) for i in range(1 + replicas)
        ]
        for replica in self.nodes[1:]:
            replica.replica_of = self.nodes[0].port
        self.node_proxies = [CutProxy(node.port) for node in self.nodes]
        self.sentinels: list[SentinelProcess] = []
        self.sentinel_proxies: list[CutProxy] = []
        self._closing = threading.Event()
        self._watch: threading.Thread | None = None

    @property
    def proxies(self) -> list[CutProxy]:
        return [*self.node_proxies, *self.sentinel_proxies]

    def open(self) -> None:
        for node in self.nodes:
            node.start()
        for replica in self.nodes[1:]:
            in_sync = _wait(lambda r=replica: r.role()[2] == "connected", SETTLE_WAIT)
            assert in_sync, f"the replica :{replica.port} never synced:\n{replica.log()}"
        for index in range(3):
            self.sentinels.append(
                start_sentinel(self.directory / f"sentinel{index}", self.nodes[0].port)
            )
        replicas = [node.port for node in self.nodes[1:]]
        for sentinel in self.sentinels:
            known = _wait(lambda s=sentinel: s.knows(replicas, 2), SETTLE_WAIT)
            assert known, f"sentinel :{sentinel.port} never saw the replicas and the others"
        rewrite = {
            node.port: proxy.port for node, proxy in zip(self.nodes, self.node_proxies, strict=True)
        }
        self.sentinel_proxies = [CutProxy(s.port, rewrite) for s in self.sentinels]
        for proxy in self.proxies:
            proxy.start()

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{proxy.port}" for proxy in self.sentinel_proxies)
        return f"redis+sentinel://{hosts}/{SERVICE}/0"

    def named(self) -> int | None:
        """The primary's port as the sentinels name it (the first that answers)."""
        for sentinel in self.sentinels:
            port = port_of(sentinel.primary())
            if port is not None:
                return port
        return None

    def primary(self) -> Node:
        port = self.named()
        return next((node for node in self.nodes if node.port == port), self.nodes[0])

    def others(self, node: Node) -> list[Node]:
        return [other for other in self.nodes if other is not node]

    def pick(self, index: int) -> tuple[Node, str]:
        """The node a pause or a restart hits (the schedule's index, whatever its role), and
        how to name it: its port and whether the sentinels name it the primary."""
        node = self.nodes[index % len(self.nodes)]
        role = "primary" if node.port == self.named() else "replica"
        return node, f":{node.port} {role}"

    def cut(self, mode: str) -> None:
        for proxy in self.proxies:
            proxy.cut(mode)

    def restore(self) -> None:
        for proxy in self.proxies:
            proxy.restore()

    def agreed(self) -> int | None:
        """The primary every sentinel names, once they agree and it answers as one."""
        named = {port_of(sentinel.primary()) for sentinel in self.sentinels}
        if len(named) != 1:
            return None
        port = named.pop()
        node = next((node for node in self.nodes if node.port == port), None)
        return port if node is not None and node.role()[0] == "master" else None

    def settle(self, timeout: float = SETTLE_WAIT) -> str | None:
        """Wait (bounded) until the sentinels agree on a primary that answers as one, and
        every other node is its replica, in sync; what is not so after `timeout`, or None."""

        began = time.monotonic()

        def in_sync(node: Node, port: int) -> bool:
            role = node.role()
            stray = role[0] == "master" or (role[0] == "slave" and role[1] != port)
            if stray and time.monotonic() - began > NUDGE_AFTER:
                node.command("REPLICAOF", "127.0.0.1", str(port))
            return role == ("slave", port, "connected") and all(
                sentinel.sees_replica(node.port, port) for sentinel in self.sentinels
            )

        def settled() -> bool:
            port = self.agreed()
            if port is None:
                return False
            return all([in_sync(node, port) for node in self.nodes if node.port != port])

        if _wait(settled, timeout):
            return None
        return f"not settled after {timeout:g}s: {self.describe()}"

    def restart(self, index: int) -> str:
        """SIGTERM to one node, the primary or a replica (it fsyncs its AOF), and a start on
        its directory as what it was: the primary, or a replica of the named primary."""
        node, name = self.pick(index)
        primary = self.named()
        node.replica_of = primary if primary != node.port else None
        return f"{name} exit {node.restart()}"

    def failover(self) -> str:
        """`SENTINEL FAILOVER` (the replicas in sync first), and the announcement."""
        unsettled = self.settle()
        old = self.named()
        reply = self.sentinels[0].ask("failover", SERVICE)
        if reply is None:
            return f"refused from :{old}; {unsettled or 'settled'}"
        new = _wait(lambda: (port := self.named()) != old and port, FAILOVER_WAIT)
        return f":{old} -> :{new or '?'}" + (f"; {unsettled}" if unsettled else "")

    def kill_primary(self) -> str:
        """SIGKILL to the current primary (the replicas in sync first); once the sentinels
        name one of the others, the killed one starts again on its AOF as that one's replica."""
        unsettled = self.settle()
        node = self.primary()
        assert node.proc is not None
        node.proc.kill()
        node.proc.wait(timeout=START_TIMEOUT)
        node.proc = None
        others = {other.port for other in self.others(node)}
        promoted = _wait(lambda: (port := self.named()) in others and port, FAILOVER_WAIT)
        node.replica_of = promoted or None
        node.start()
        return (
            f":{node.port} killed, "
            + (f":{promoted} promoted" if promoted else f"none promoted in {FAILOVER_WAIT:g}s")
            + "; restarted"
            + (f"; {unsettled}" if unsettled else "")
        )

    def failback(self, early: bool) -> str:
        """SIGKILL to the current primary (the replicas in sync first); once the sentinels
        name another, the killed one starts again on its AOF as it was, a primary, which the
        sentinels turn into a replica (about ten seconds); once it is in sync, `SENTINEL
        FAILOVER` (with one Redis replica, back to it). `early`: as soon as the node itself
        says it is in sync, before every sentinel has looked at it as a replica (one that
        last saw it a primary may convert it back once promoted); else once settled."""
        unsettled = self.settle()
        node = self.primary()
        assert node.proc is not None
        node.proc.kill()
        node.proc.wait(timeout=START_TIMEOUT)
        node.proc = None
        others = {other.port for other in self.others(node)}
        promoted = _wait(lambda: (port := self.named()) in others and port, FAILOVER_WAIT)
        node.replica_of = None  # as it was: the sentinels convert it
        node.start()
        if early:
            synced = _wait(lambda: node.role() == ("slave", promoted, "connected"), SETTLE_WAIT)
            converted = "in sync" if synced else f"not in sync after {SETTLE_WAIT:g}s"
        else:
            converted = self.settle() or "settled"
        node.replica_of = promoted or None
        old = self.named()
        reply = self.sentinels[0].ask("failover", SERVICE)
        new = _wait(lambda: (port := self.named()) != old and port, FAILOVER_WAIT)
        return (
            f":{node.port} killed, :{promoted or '?'} promoted; restarted a primary, "
            f"{converted}; failover from :{old} "
            + (f"to :{new or '?'}" if reply is not None else "refused")
            + (f"; {unsettled}" if unsettled else "")
        )

    def replicated(self) -> int | None:
        """The primary every sentinel names, if it answers as one, another node says it is
        its replica in sync, and so does every node a sentinel could promote (a told write
        can be acknowledged only then: it waits for each); else None."""
        port = self.agreed()
        if port is None:
            return None
        others = [node for node in self.nodes if node.port != port]
        synced = {node.port for node in others if node.role() == ("slave", port, "connected")}
        promotable = {each for sentinel in self.sentinels for each in sentinel.promotable()}
        return port if synced and promotable - {port} <= synced else None

    def watch_replication(self, told: Callable[[bool, str], None]) -> None:
        """Until `close`, every REPLICATION_POLL seconds, whether a told write could be
        acknowledged (`replicated`): `told(False, ...)` when it stops, `told(True, ...)`
        when it holds again. Observed, not inferred from the nemesis's steps: a span begins
        when a look sees it (a failover's first second, before any promotion, is not in it)."""

        def watch() -> None:
            replicated = True
            while not self._closing.wait(REPLICATION_POLL):  # polling, until closed
                port = self.replicated()
                if (port is not None) != replicated:
                    replicated = port is not None
                    told(replicated, f"a replica of :{port} in sync" if port else self.describe())

        self._watch = threading.Thread(target=watch, name="replication-watch", daemon=True)
        self._watch.start()

    def heal(self) -> str | None:
        """Every node running and not stopped (one that is not starts as the replica of the
        named primary), every proxy open; then settled (bounded)."""
        for node in self.nodes:
            if node.running():
                with contextlib.suppress(OSError):
                    node.send(signal.SIGCONT)
        for node in self.nodes:
            if not node.running():
                primary = self.named()
                node.replica_of = primary if primary != node.port else None
                node.start()
        self.restore()
        return self.settle()

    def describe(self) -> str:
        roles = ", ".join(f":{node.port} {node.role()}" for node in self.nodes)
        named = [port_of(sentinel.primary()) for sentinel in self.sentinels]
        return f"sentinels name {named}; {roles}"

    def close(self) -> None:
        self._closing.set()
        if self._watch is not None:
            self._watch.join(timeout=10)
        for proxy in self.proxies:
            proxy.stop()
        for sentinel in self.sentinels:
            sentinel.stop()
        for node in self.nodes:
            if node.running():
                with contextlib.suppress(OSError):
                    node.send(signal.SIGCONT)
            node.kill()


RedisUnderTest = PlainRedis | SentinelRedis
