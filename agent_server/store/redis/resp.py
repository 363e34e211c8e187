"""One multiplexed connection to Redis, for the store's scripts.

Redis answers the commands of one connection in the order they came, so concurrent callers
can share one connection: each call appends a future to a queue and writes its command, and
each reply resolves the oldest future. There is no pool to take a connection from and no
per-call timer: one timer watches the oldest unanswered command, and a connection that
leaves it unanswered past `timeout` is dropped, failing every call waiting on it (as
redis-py's socket timeout drops its connection). hiredis, the parser redis-py itself uses,
packs the commands and parses the replies.

Why not redis-py here: its asyncio client takes a pooled connection, packs in Python and
arms a timeout for every call, about 35 us of CPU per call on the machines of
bench/RESULTS.md against 7 us here, and a store operation is on the path of every request.
redis-py keeps what it does well: pub/sub, and the store's less frequent commands.

A link given a `Locator` (Sentinel, agent_server/store/redis/sentinel.py) asks it where the primary
is on every connect, checks with `ROLE` that the node is the primary, and retires a connection
that answers `READONLY` (a demoted primary), so that the next call asks again.

A link given an `Acknowledgement` (`PUBLISH`, then `WAIT n <ms>`) acknowledges writes sent
with `call_acked` once replicas hold them, in groups: one acknowledgement follows every write
sent before it on the same connection, at most one is in flight, and the writes sent
meanwhile share the next one (Redis runs nothing else of a connection while its `WAIT` blocks
it). Its commands may change (how many replicas to wait for); the next group takes the new
ones.
"""

from __future__ import annotations

import asyncio
import ssl
from collections import deque
from collections.abc import Callable, Sequence
from typing import Any, Protocol, cast

import hiredis
from redis.asyncio.connection import SSLConnection, UnixDomainSocketConnection, parse_url
from redis.exceptions import (
    AuthenticationError,
    BusyLoadingError,
    ConnectionError,
    NoScriptError,
    OutOfMemoryError,
    ReadOnlyError,
    ResponseError,
    TryAgainError,
)


class NoReply(ConnectionError):
    """No reply within the command timeout. The connection is dropped (its replies would
    come out of step), but this is what a slow command looks like too: the store asks its
    probe before it calls Redis unreachable."""


#: Error replies by their first word, as redis-py maps them.
_ERRORS: dict[str, type[ResponseError] | type[ConnectionError]] = {
    "NOSCRIPT": NoScriptError,
    "READONLY": ReadOnlyError,
    "LOADING": BusyLoadingError,
    "OOM": OutOfMemoryError,
    "TRYAGAIN": TryAgainError,
    "NOAUTH": AuthenticationError,
    "WRONGPASS": AuthenticationError,
}

#: An FCALL of a function Redis does not have.
_NO_FUNCTION = "ERR Function not found"

Command = Sequence[str | bytes | int | float]
#: A host and port.
Address = tuple[str, int]


class Locator(Protocol):
    """Where a link connects when its URL cannot say: the primary, which moves."""

    async def primary(self) -> Address:
        """Where the primary is now; ConnectionError when nobody can say."""
        ...

    def not_primary(self, address: Address) -> None:
        """The node at `address` answered that it is not the primary."""
        ...


def reply_error(message: str) -> Exception:
    """The redis-py exception for an error reply, so callers handle one set of errors. A
    function Redis lacks is a NoScriptError, as a script it lacks is: either way the
    caller loads them and sends again."""
    if message.startswith(_NO_FUNCTION):
        return NoScriptError(message)
    kind = _ERRORS.get(message.split(" ", 1)[0], ResponseError)
    return kind(message)


async def _all(futures: list[asyncio.Future[Any]]) -> list[Any]:
    """Every reply, in order, or the first failure; either way every future is observed
    (a reset fails them all at once, and one left unread is logged as a lost error)."""
    try:
        return [await future for future in futures]
    finally:
        for future in futures:
            if not future.done():
                future.cancel()
            elif not future.cancelled():
                future.exception()


def _pack(command: Command) -> bytes:
    packed: bytes = hiredis.pack_command(cast(Any, tuple(command)))
    return packed


def _observe(future: asyncio.Future[Any]) -> None:
    """A done callback: an error nobody awaits is not logged as lost."""
    if not future.cancelled():
        future.exception()


def _settle(futures: Sequence[asyncio.Future[Any]], outcome: Any) -> None:
    """Give each waiting future `outcome` (an exception is raised to its awaiter)."""
    for future in futures:
        if future.done():
            continue
        if isinstance(outcome, BaseException):
            future.set_exception(outcome)
        else:
            future.set_result(outcome)


async def replies(futures: list[asyncio.Future[Any]]) -> list[Any]:
    """A pipeline's replies, each reply or error reply (as an exception, in its place). A
    lost connection raises for the whole pipeline; a caller that goes away leaves them."""
    answers: list[Any] = []
    failure: Exception | None = None
    try:
        for future in futures:
            try:
                answers.append(await future)
            except ResponseError as exc:
                answers.append(exc)
            except Exception as exc:  # the connection: every later reply fails alike
                failure = failure or exc
    finally:
        for future in futures:  # a caller that went away: its replies are skipped
            future.cancel()
    if failure is not None:
        raise failure
    return answers


class Acknowledgement:
    """The commands sent after a group of writes to acknowledge them; the last one's reply
    is the acknowledgement. Shared by a link and its connections, and changed in place."""

    __slots__ = ("count", "packed")

    def __init__(self, commands: Sequence[Command]) -> None:
        self.packed = b""
        self.count = 0
        self.set(commands)

    def set(self, commands: Sequence[Command]) -> None:
        self.packed = b"".join(_pack(command) for command in commands)
        self.count = len(commands)


class _Protocol(asyncio.Protocol):
    """Replies resolve the oldest waiting future; a lost connection fails them all."""

    def __init__(
        self, timeout: float, *, follow: bool = False, ack: Acknowledgement | None = None
    ) -> None:
        self.timeout = timeout
        #: The commands that acknowledge the writes before them; the last one's reply is the
        #: acknowledgement (WAIT's count of replicas).
        self.ack = ack
        #: The acknowledgement in flight (its reply's future) and whose writes it covers.
        self._ack_sent: tuple[asyncio.Future[Any], list[asyncio.Future[Any]]] | None = None
        #: Whose writes wait for the next acknowledgement (sent once the one in flight is in).
        self._ack_next: list[asyncio.Future[Any]] = []
        #: Set for a located link: a READONLY reply retires the connection.
        self.follow = follow
        #: Takes no new commands; closes once the ones sent are answered.
        self.retired = False
        #: Where it is connected, for a located link.
        self.address: Address | None = None
        self.reader = hiredis.Reader(encoding="utf-8")
        self.waiting: deque[tuple[asyncio.Future[Any], float]] = deque()
        self.transport: asyncio.Transport | None = None
        self.closed: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        #: A subscriber's: takes each reply no command waits for (a published message).
        self.on_push: Callable[[Any], None] | None = None
        self._timer: asyncio.TimerHandle | None = None
        self._out: list[bytes] = []

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self._timer is not None:
            self._timer.cancel()
        self._fail(ConnectionError(f"connection to Redis lost: {exc or 'closed'}"))
        if not self.closed.done():
            self.closed.set_result(None)

    def data_received(self, data: bytes) -> None:
        try:
            self.reader.feed(data)
            while (reply := self.reader.gets()) is not False:
                if self.on_push is not None and not self.waiting:
                    self.on_push(reply)
                    continue
                future, _ = self.waiting.popleft()
                error = reply_error(str(reply)) if isinstance(reply, hiredis.ReplyError) else None
                if self.follow and isinstance(error, ReadOnlyError):
                    self.retired = True  # no longer the primary: the next call locates it
                if self._ack_sent is not None and future is self._ack_sent[0]:
                    self._acked(reply if error is None else error)
                if future.done():  # its caller went away
                    continue
                if error is not None:
                    future.set_exception(error)
                else:
                    future.set_result(reply)
        except (hiredis.ProtocolError, IndexError) as exc:  # out of step: start over
            self.abort(f"unexpected data from Redis: {exc}")
            return
        if self.retired:
            self.retire()

    def retire(self) -> None:
        """Take no new commands, and close once the ones sent are answered."""
        self.retired = True
        if not self.waiting and self.transport is not None:
            self.transport.close()

    @property
    def open(self) -> bool:
        return self.transport is not None and not self.transport.is_closing() and not self.retired

    def send(self, payload: bytes, count: int, *, now: bool = False) -> list[asyncio.Future[Any]]:
        """`now`: written within this loop turn, with what this turn sent before it (a
        backlog's pipeline, so Redis works while a long turn goes on); otherwise the
        commands of one loop turn leave in one write at its end."""
        if self.transport is None or self.transport.is_closing():
            raise ConnectionError("connection to Redis lost")
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        futures = [loop.create_future() for _ in range(count)]
        self.waiting.extend((future, deadline) for future in futures)
        if not self._out and not now:
            loop.call_soon(self._flush)
        self._out.append(payload)
        if now:
            self._flush()
        if self._timer is None:
            self._timer = loop.call_at(deadline, self._check)
        return futures

    @property
    def unsent(self) -> int:
        """Bytes the transport holds that the socket did not take yet."""
        return 0 if self.transport is None else self.transport.get_write_buffer_size()

    def send_acked(self, payload: bytes) -> tuple[asyncio.Future[Any], asyncio.Future[Any]]:
        """Send one write; the futures of its reply and of the acknowledgement that covers
        it (the `ack` sent after it on this connection: at the end of this loop turn, or
        once the acknowledgement in flight is in)."""
        assert self.ack is not None, "a link without ack commands"
        (reply,) = self.send(payload, 1)
        acked = asyncio.get_running_loop().create_future()
        self._ack_next.append(acked)
        return reply, acked

    def _send_ack(self) -> None:
        """The acknowledgement of every write waiting for one, after them on the wire."""
        assert self.ack is not None
        payload, count = self.ack.packed, self.ack.count
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.timeout
        futures = [loop.create_future() for _ in range(count)]
        for future in futures:
            future.add_done_callback(_observe)  # internal: nobody awaits them
        self.waiting.extend((future, deadline) for future in futures)
        if not self._out:
            loop.call_soon(self._flush)
        self._out.append(payload)
        if self._timer is None:
            self._timer = loop.call_at(deadline, self._check)
        self._ack_sent, self._ack_next = (futures[-1], self._ack_next), []

    def _acked(self, outcome: Any) -> None:
        """The acknowledgement in flight is in: to the writes it covers; the next one goes."""
        assert self._ack_sent is not None
        _, covered = self._ack_sent
        self._ack_sent = None
        _settle(covered, outcome)
        if self._ack_next and self.transport is not None and not self.transport.is_closing():
            self._send_ack()

    def _flush(self) -> None:
        if self._ack_next and self._ack_sent is None and self.transport is not None:
            self._send_ack()  # this turn's writes, then their acknowledgement
        out, self._out = self._out, []
        if out and self.transport is not None:
            self.transport.write(b"".join(out))

    def _check(self) -> None:
        """The oldest command is answered by its deadline, or the connection goes."""
        self._timer = None
        if not self.waiting:
            return
        loop = asyncio.get_running_loop()
        deadline = self.waiting[0][1]
        if deadline <= loop.time():
            self.abort(f"no reply from Redis in {self.timeout:g} s", NoReply)
        else:
            self._timer = loop.call_at(deadline, self._check)

    def abort(self, why: str, kind: type[ConnectionError] = ConnectionError) -> None:
        if self.transport is not None:
            self.transport.abort()  # its connection_lost comes in a later loop turn
        self._fail(kind(why))

    def _fail(self, error: ConnectionError) -> None:
        """Every command still waiting fails with `error`, and every acknowledgement."""
        while self.waiting:
            future, _ = self.waiting.popleft()
            if not future.done():
                future.set_exception(error)
        covered = [*(self._ack_sent[1] if self._ack_sent is not None else ()), *self._ack_next]
        self._ack_sent, self._ack_next = None, []
        _settle(covered, error)


class RedisLink:
    """Connects on first use and again after a loss; `call` and `pipeline` share it.

    With `locator`, the host and port come from it on every connect (the rest of `url`,
    credentials, db and TLS, still applies) and the node must answer `ROLE` as the primary.
    With `ack`, the commands that acknowledge writes sent with `call_acked`."""

    def __init__(
        self,
        url: str,
        *,
        connect_timeout: float,
        timeout: float,
        locator: Locator | None = None,
        ack: Acknowledgement | None = None,
    ) -> None:
        self.url = url
        self.options = parse_url(url)
        self.connect_timeout = connect_timeout
        self.timeout = timeout
        self.locator = locator
        self._ack = ack
        self._protocol: _Protocol | None = None
        self._connecting = asyncio.Lock()
        self._twins: list[RedisLink] = []

    async def call(self, *args: str | bytes | int | float) -> Any:
        protocol = self._protocol
        if protocol is None or not protocol.open:
            protocol = await self._connect()
        (future,) = protocol.send(_pack(args), 1)
        return await future

    async def call_acked(self, *args: str | bytes | int | float) -> tuple[Any, Any]:
        """One write and the reply of the acknowledgement that followed it on the same
        connection (an exception in its place when there was none: the write may have
        happened all the same). The write's own failure raises, as `call`'s does."""
        answer, acked, _ = await self.call_acked_at(*args)
        return answer, acked

    async def call_acked_at(
        self, *args: str | bytes | int | float
    ) -> tuple[Any, Any, Address | None]:
        """`call_acked`, and where (a located link) the write went: the node whose state
        decides whether the acknowledgement can be trusted."""
        protocol = self._protocol
        if protocol is None or not protocol.open:
            protocol = await self._connect()
        where = protocol.address
        reply, acked = protocol.send_acked(_pack(args))
        try:
            answer = await reply
            try:
                return answer, await acked, where
            except Exception as exc:
                return answer, exc, where
        finally:
            for future in (reply, acked):  # a caller that went away: the replies are skipped
                future.cancel()
                if not future.cancelled():
                    _observe(future)

    async def pipeline(self, commands: Sequence[Command]) -> list[Any]:
        """One write for every command; each reply or error reply (as an exception, in
        its place). A lost connection raises for the whole pipeline."""
        return await replies(await self.send(commands))

    async def send(self, commands: Sequence[Command]) -> list[asyncio.Future[Any]]:
        """A pipeline sent (connected first if need be: otherwise at once, with no loop turn
        in between), its replies read later by `replies`. Pipelines sent one after another
        on one connection (`connected` all along) are run by Redis in that order."""
        protocol = self._protocol
        if protocol is None or not protocol.open:
            protocol = await self._connect()
        return protocol.send(b"".join(map(_pack, commands)), len(commands))

    def send_now(self, commands: Sequence[Command]) -> list[asyncio.Future[Any]] | None:
        """A pipeline written within this loop turn, when the connection is up and the
        socket took everything sent before (otherwise None: nothing is sent): Redis runs it
        while this turn goes on. Its replies are read once the loop polls again."""
        protocol = self._writable()
        if protocol is None:
            return None
        return protocol.send(b"".join(map(_pack, commands)), len(commands), now=True)

    @property
    def writable(self) -> bool:
        """Whether `send_now` would send: connected, and the socket took all sent before."""
        return self._writable() is not None

    def _writable(self) -> _Protocol | None:
        protocol = self._protocol
        return protocol if protocol is not None and protocol.open and not protocol.unsent else None

    @property
    def connected(self) -> bool:
        """Whether the next command goes on the connection the last one took."""
        return self._protocol is not None and self._protocol.open

    async def subscribe(
        self, channels: Sequence[str], on_message: Callable[[str, str], None]
    ) -> asyncio.Future[None]:
        """Make this link a subscriber of `channels` (it takes no other command): each
        message published there goes to `on_message(channel, data)`, parsed by hiredis as
        every reply is (redis-py's pub/sub costs several times as much per message, and
        every replica hears every end). Returns the future that is done when the connection
        is lost; a new `subscribe` connects again."""
        protocol = self._protocol
        if protocol is None or not protocol.open:
            protocol = await self._connect()

        def pushed(reply: Any) -> None:
            if isinstance(reply, list) and len(reply) == 3 and reply[0] == "message":
                on_message(str(reply[1]), str(reply[2]))

        protocol.on_push = pushed  # before the confirmations: a message may follow them
        await _all(protocol.send(_pack(("SUBSCRIBE", *channels)), len(channels)))
        return protocol.closed

    def twin(self, ack: Acknowledgement | None = None) -> RedisLink:
        """Another link to the same place (the same locator): a subscriber beside the
        commands' link, or one whose writes are acknowledged (`ack`). Retiring this link
        retires its twins too."""
        twin = RedisLink(
            self.url,
            connect_timeout=self.connect_timeout,
            timeout=self.timeout,
            locator=self.locator,
            ack=ack,
        )
        self._twins.append(twin)
        return twin

    @property
    def address(self) -> Address | None:
        """Where a located link is connected now, if it is."""
        protocol = self._protocol
        return protocol.address if protocol is not None and protocol.open else None

    def addresses(self) -> list[Address]:
        """Where this link and its twins are connected now."""
        found = [link.address for link in (self, *self._twins)]
        return [address for address in found if address is not None]

    def retire(self) -> None:
        """The primary moved: the next call connects (and asks the locator) again, while
        the replies to the commands already sent still reach their callers."""
        if self._protocol is not None:
            self._protocol.retire()
        for twin in self._twins:
            twin.retire()

    async def close(self) -> None:
        protocol, self._protocol = self._protocol, None
        if protocol is not None and protocol.open:
            protocol.transport.close()  # type: ignore[union-attr]
            await asyncio.wait({protocol.closed}, timeout=self.connect_timeout)

    async def _connect(self) -> _Protocol:
        async with self._connecting:
            if self._protocol is not None and self._protocol.open:
                return self._protocol
            protocol: _Protocol | None = None
            try:
                async with asyncio.timeout(self.connect_timeout):
                    address = None if self.locator is None else await self.locator.primary()
                    protocol = await self._open(address)
                    protocol.address = address
                    await self._hello(protocol, address)
            except BaseException as exc:
                if protocol is not None:
                    protocol.abort("set-up failed")
                if isinstance(exc, TimeoutError):
                    raise ConnectionError(
                        f"no connection to Redis in {self.connect_timeout:g} s"
                    ) from None
                if isinstance(exc, OSError):
                    raise ConnectionError(str(exc)) from None
                raise
            self._protocol = protocol
            return protocol

    async def _open(self, address: Address | None) -> _Protocol:
        """Connect to `address`, or where the URL says."""
        loop = asyncio.get_running_loop()
        options = self.options
        kind = options.get("connection_class")
        if kind is UnixDomainSocketConnection and address is None:
            _, protocol = await loop.create_unix_connection(
                lambda: _Protocol(self.timeout, ack=self._ack), str(options["path"])
            )
            return protocol
        context: ssl.SSLContext | None = None
        if kind is SSLConnection:  # rediss://, with redis-py's `ssl_ca_certs` and `ssl_cert_reqs`
            cafile = options.get("ssl_ca_certs")
            context = ssl.create_default_context(cafile=None if cafile is None else str(cafile))
            if str(options.get("ssl_cert_reqs", "required")).lower() == "none":
                context.check_hostname = False
                context.verify_mode = ssl.CERT_NONE
        if address is None:
            address = (str(options.get("host", "localhost")), int(options.get("port", 6379)))
        _, protocol = await loop.create_connection(
            lambda: _Protocol(self.timeout, follow=self.locator is not None, ack=self._ack),
            *address,
            ssl=context,
        )
        return protocol

    async def _hello(self, protocol: _Protocol, address: Address | None) -> None:
        """AUTH and SELECT as the URL says, before any caller's command; on a located
        node, ROLE: a replica (the locator's view is behind) is no place to write."""
        commands: list[Command] = []
        password = self.options.get("password")
        if password is not None:
            username = self.options.get("username")
            commands.append(("AUTH", username, password) if username else ("AUTH", password))
        if int(self.options.get("db", 0) or 0):
            commands.append(("SELECT", int(self.options["db"])))
        if address is not None:
            commands.append(("ROLE",))
        if not commands:
            return
        payload = b"".join(_pack(command) for command in commands)
        replies = await _all(protocol.send(payload, len(commands)))
        if address is not None and self.locator is not None:
            role = replies[-1][0] if isinstance(replies[-1], list) and replies[-1] else "?"
            if role != "master":
                self.locator.not_primary(address)
                host, port = address
                raise ConnectionError(
                    f"{host}:{port} answers ROLE {role}, not master: not the primary (yet)"
                )
