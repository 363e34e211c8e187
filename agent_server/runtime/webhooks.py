"""Webhooks: the end of an execution, and its requests for input, POSTed to a URL.

The store records each delivery with the move it reports (lua/webhooks.lua for Redis, in
the same script; in this process for the memory store) and `WebhookSender` delivers them:
it claims what is due (any replica may, under a lease), checks the target against the
allow-list (every address the host resolves to), signs the body per Standard Webhooks with
the `standardwebhooks` library, and POSTs it with httpx. 2xx is delivered; 410 and any
other 4xx but 408 and 429 give up; the rest (5xx, 408, 429, a redirect, a timeout, a
connection error) is tried again with exponential backoff and full jitter, under the same
`webhook-id`, until `--webhook-retry-for` has passed since the move. Whatever an attempt
meets ends in one of OUTCOMES: a URL that can never be delivered (a host no resolver takes)
gives up at once, anything else unforeseen is retried; the answer's body is read up to
MAX_RESPONSE_BYTES and no further. docs/webhooks.md.
"""

from __future__ import annotations

import asyncio
import base64
import binascii
import ipaddress
import logging
import random
import socket
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol
from urllib.parse import urlsplit

import httpx
from standardwebhooks import Webhook

from agent_server.model import jsoncodec
from agent_server.model.counts import counted
from agent_server.model.redaction import shown_url
from agent_server.store.base import Delivery
from agent_server.store.roles import Webhooks

logger = logging.getLogger("agent_server.webhooks")

#: Seconds one attempt may take, connection included.
ATTEMPT_TIMEOUT = 10.0
#: Seconds a claimed delivery is left to its claimer before another replica may take it:
#: one attempt and a margin.
CLAIM_LEASE = ATTEMPT_TIMEOUT + 5.0
#: Seconds between looks for deliveries due (other replicas' retries; a missed wake-up).
POLL_INTERVAL = 1.0
#: Seconds after a retry's due time this replica looks for it: the store's clock may be a
#: little behind this one's.
DUE_MARGIN = 0.02
#: Attempts under way at once on one replica.
CONCURRENCY = 16
#: The longest wait between two attempts.
MAX_RETRY_DELAY = 3600.0
#: The longest URL a start may give.
MAX_URL_LENGTH = 2048
#: The longest host name (DNS: 253 characters, a trailing dot aside) and label.
MAX_HOST_LENGTH, MAX_LABEL_LENGTH = 253, 63
#: Bytes of a receiver's answer read at most; the rest is never read (the connection is
#: closed), so an answer without end costs no more than this.
MAX_RESPONSE_BYTES = 64 * 1024
#: Secret bytes, as the Standard Webhooks spec recommends them.
SECRET_BYTES = (24, 64)
#: The outcomes of an attempt (`webhook_deliveries_total{outcome}`).
OUTCOMES = ("delivered", "retried", "gave_up", "refused")


def first_retry_delay(retry_for: float) -> float:
    """The bound of the first retry's wait: 1 s, or a hundredth of `--webhook-retry-for`
    when that is shorter (so a short retry window still holds several attempts)."""
    return min(1.0, retry_for / 100)


def retry_delay(attempts: int, retry_for: float, draw: Callable[[], float]) -> float:
    """Full jitter (uniform between 0 and the bound) over a bound that doubles with each
    failed attempt (`attempts`: 1 after the first), capped at MAX_RETRY_DELAY."""
    bound = min(MAX_RETRY_DELAY, first_retry_delay(retry_for) * 2.0 ** min(attempts - 1, 40))
    return draw() * bound


def check_url(url: str, what: str) -> str:
    """An absolute http(s) URL with a host, printable ASCII and at most MAX_URL_LENGTH
    characters; ValueError naming `what` otherwise."""
    rule = f"{what} must be an absolute http:// or https:// URL (at most {MAX_URL_LENGTH} chars)"
    if not 0 < len(url) <= MAX_URL_LENGTH or not all(0x21 <= ord(c) < 0x7F for c in url):
        raise ValueError(rule)
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises for a port that is not a number
    except ValueError:
        raise ValueError(rule) from None
    if parts.scheme not in ("http", "https") or not parts.hostname or parts.fragment:
        raise ValueError(rule)
    problem = host_problem(parts.hostname)
    if problem is not None:
        raise ValueError(f"{what}'s host {problem}")
    return url


def host_problem(host: str) -> str | None:
    """Why a URL's host (brackets removed) can never be resolved, None when it may be: an
    address, or a name of letters, digits, '-', '_' and '.' (as `--webhook-allow` names
    hosts) in labels of 1 to 63 characters, at most 253 in all, that the resolver's IDNA
    codec takes (an `xn--` label must decode)."""
    try:
        ipaddress.ip_address(host.split("%", 1)[0])
        return None
    except ValueError:
        pass
    name = host[:-1] if host.endswith(".") else host
    if not all(c.isascii() and (c.isalnum() or c in "-_.") for c in name):
        return "has a character no host name has (letters, digits, '-', '_' and '.')"
    if len(name) > MAX_HOST_LENGTH:
        return f"is longer than {MAX_HOST_LENGTH} characters"
    labels = name.split(".")
    if not all(labels):
        return "has an empty label"
    if any(len(label) > MAX_LABEL_LENGTH for label in labels):
        return f"has a label longer than {MAX_LABEL_LENGTH} characters"
    try:
        name.encode("idna").decode("idna")
    except UnicodeError:
        return "is not a valid IDNA name"
    return None


def check_secret(secret: str) -> str:
    """`whsec_` and the base64 of 24 to 64 bytes (what the Standard Webhooks libraries
    generate and read); ValueError otherwise (never echoing it)."""
    if not secret.startswith("whsec_"):
        raise ValueError("webhook secret must be whsec_ followed by base64 (Standard Webhooks)")
    try:
        key = base64.b64decode(secret[len("whsec_") :], validate=True)
    except (binascii.Error, ValueError):
        raise ValueError("webhook secret's part after whsec_ is not valid base64") from None
    low, high = SECRET_BYTES
    if not low <= len(key) <= high:
        raise ValueError(f"webhook secret must hold {low} to {high} bytes (it holds {len(key)})")
    return secret


def read_secret_file(path: str) -> str:
    """The secret in a mounted file (surrounding whitespace dropped), checked."""
    try:
        with open(path, encoding="utf-8") as file:
            text = file.read().strip()
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ValueError(f"webhook-secret-file {path!r} cannot be read: {reason}") from None
    return check_secret(text)


_Network = ipaddress.IPv4Network | ipaddress.IPv6Network
_Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class AllowList:
    """`--webhook-allow`: host names, and networks (a CIDR, or one address), that may be
    targets although they are not public (loopback, private, link-local)."""

    hosts: frozenset[str] = frozenset()
    networks: tuple[_Network, ...] = ()

    @classmethod
    def parse(cls, entries: Iterable[str]) -> AllowList:
        hosts: set[str] = set()
        networks: list[_Network] = []
        for entry in entries:
            try:
                networks.append(ipaddress.ip_network(entry, strict=False))
                continue
            except ValueError:
                pass
            name = entry.lower().rstrip(".")
            if not name or any(not (c.isalnum() or c in "-._") for c in name) or "/" in entry:
                raise ValueError(f"webhook-allow {entry!r} is neither a host name nor a CIDR")
            hosts.add(name)
        return cls(frozenset(hosts), tuple(networks))

    def refusal(self, host: str, addresses: Iterable[_Address]) -> str | None:
        """Why the target may not be contacted (None: it may): an address that is not
        public and not allowed. Every address the host resolves to is checked, since the
        connection may take any of them."""
        if host.lower().rstrip(".") in self.hosts:
            return None
        for address in addresses:
            if isinstance(address, ipaddress.IPv6Address) and address.ipv4_mapped is not None:
                address = address.ipv4_mapped
            if address.is_global or any(address in network for network in self.networks):
                continue
            return f"{address} is not a public address (loopback, private, link-local or reserved)"
        return None


class WebhookObserver(Protocol):
    """Told each attempt's outcome and how many deliveries are pending; metrics."""

    def webhook_delivery(self, outcome: str) -> None: ...

    def webhooks_pending(self, count: int) -> None: ...


#: Headers added to every attempt beyond the Standard Webhooks ones (a trace's
#: `traceparent`, for one): given the delivery, pairs of name and value.
ExtraHeaders = Callable[[Delivery], Iterable[tuple[str, str]]]


def _no_headers(delivery: Delivery) -> Iterable[tuple[str, str]]:
    return ()


class WebhookSender:
    """One per replica: claims due deliveries from the store and makes one attempt at
    each, at most CONCURRENCY at once; woken by the store when this replica recorded a
    move that may owe one, else it looks every POLL_INTERVAL."""

    def __init__(
        self,
        store: Webhooks,
        *,
        secret: str,
        allow: AllowList,
        retry_for: float,
        observer: WebhookObserver | None = None,
        extra_headers: ExtraHeaders = _no_headers,
        user_agent: str = "agent-server",
    ) -> None:
        self.store = store
        self.signer = Webhook(secret)
        self.allow = allow
        self.retry_for = retry_for
        self.observer = observer
        self.extra_headers = extra_headers
        self.user_agent = user_agent
        self.draw: Callable[[], float] = random.random
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._attempts: set[asyncio.Task[None]] = set()
        #: The ids of the deliveries under way here.
        self._under_way: set[str] = set()
        #: When the soonest retry this replica scheduled falls due (loop time), if any: the
        #: sender looks then, not at its next poll, so "next in X s" holds.
        self._next_due: float | None = None
        self._client: httpx.AsyncClient | None = None
        self._pending = 0

    def start(self) -> None:
        """Start looking for deliveries (the store is open)."""
        self.store.deliver_webhooks(self.wake)
        self._client = httpx.AsyncClient(
            timeout=httpx.Timeout(ATTEMPT_TIMEOUT),
            follow_redirects=False,  # a redirect could lead past the allow-list
            trust_env=False,
            limits=httpx.Limits(max_connections=CONCURRENCY),
        )
        self._task = asyncio.create_task(self._run(), name="webhook-sender")

    def wake(self) -> None:
        self._wake.set()

    async def _run(self) -> None:
        loop = asyncio.get_running_loop()
        while True:
            self._wake.clear()
            if self._next_due is not None and loop.time() >= self._next_due:
                self._next_due = None  # this look claims it (the store's clock may lag a hair)
            room = CONCURRENCY - len(self._attempts)
            if room > 0:
                try:
                    pending, claimed = await self.store.claim_webhooks(room, CLAIM_LEASE)
                except Exception as exc:  # the store is down: look again later
                    logger.debug("webhook claim failed: %s", type(exc).__name__)
                    pending, claimed = self._pending, []
                self._set_pending(pending)
                for delivery in claimed:
                    self._launch(delivery)
                if len(claimed) == room:
                    continue  # more may be due
            wait = POLL_INTERVAL
            if self._next_due is not None:
                wait = max(0.0, min(wait, self._next_due - loop.time()))
            try:
                async with asyncio.timeout(wait):
                    await self._wake.wait()
            except TimeoutError:
                pass

    def _due_in(self, seconds: float) -> None:
        """A retry recorded here falls due in `seconds`: look for it then (with a margin for
        the store's clock, Redis's TIME on another machine)."""
        due = asyncio.get_running_loop().time() + seconds + DUE_MARGIN
        if self._next_due is None or due < self._next_due:
            self._next_due = due
            self._wake.set()  # the loop recomputes its wait

    def _launch(self, delivery: Delivery, deadline: float | None = None) -> None:
        if delivery.delivery_id in self._under_way:
            return  # claimed again while its attempt is under way (the last chance)
        self._under_way.add(delivery.delivery_id)
        task = asyncio.create_task(self._attempt(delivery, deadline), name="webhook-attempt")
        self._attempts.add(task)
        task.add_done_callback(self._attempt_done)

    def _attempt_done(self, task: asyncio.Task[None]) -> None:
        self._attempts.discard(task)
        if not task.cancelled() and task.exception() is not None:
            logger.error("webhook attempt failed", exc_info=task.exception())
        self._wake.set()  # room for another

    def _set_pending(self, count: int) -> None:
        self._pending = count
        if self.observer is not None:
            self.observer.webhooks_pending(count)

    def _count(self, outcome: str) -> None:
        if self.observer is not None:
            self.observer.webhook_delivery(outcome)

    async def _attempt(self, delivery: Delivery, deadline: float | None) -> None:
        """One attempt, and what follows from it: settled, or due again after a backoff
        (with a `deadline`, the last chance at shutdown: nothing is rescheduled)."""
        try:
            await self._attempt_once(delivery, deadline)
        finally:
            self._under_way.discard(delivery.delivery_id)

    async def _attempt_once(self, delivery: Delivery, deadline: float | None) -> None:
        outcome, why = await self.send(delivery, deadline)
        retry_in: float | None = None
        if outcome == "retried":
            delay = retry_delay(delivery.attempts + 1, self.retry_for, self.draw)
            left = self.retry_for - delivery.age
            if left <= 0:
                outcome = "gave_up"
                why = f"{why}; retried for {self.retry_for:g} s"
            else:
                retry_in = min(delay, left)
        self._count(outcome)
        if deadline is not None and outcome == "retried":
            return  # the last chance at shutdown: it stays owed (counted undelivered)
        log = {"delivered": logger.debug, "retried": logger.info}.get(outcome, logger.warning)
        log(
            "webhook %s %s to %s (attempt %d): %s%s",
            delivery.delivery_id,
            outcome.replace("_", " "),
            shown_url(delivery.url),
            delivery.attempts + 1,
            why,
            "" if retry_in is None else f"; next in {retry_in:.2f} s",
            extra={"fields": {"execution_id": delivery.data.get("execution_id")}},
        )
        try:
            self._set_pending(await self.store.settle_webhook(delivery, retry_in))
            if retry_in is not None:
                self._due_in(retry_in)
        except Exception as exc:  # the store is down: its lease runs out, it is tried again
            logger.warning(
                "webhook %s: its outcome could not be recorded (%s); it is tried again",
                delivery.delivery_id,
                type(exc).__name__,
            )

    async def send(self, delivery: Delivery, deadline: float | None = None) -> tuple[str, str]:
        """POST the delivery once: its outcome (delivered, retried, gave_up, refused) and
        why, whatever the resolver or the connection raises. A refused target is never
        contacted; a URL that can never be delivered gives up at once."""
        try:
            check_url(delivery.url, "the URL")
        except ValueError as exc:  # kept before this check existed, or by another version
            return "gave_up", f"it can never be delivered: {exc}"
        parts = urlsplit(delivery.url)
        host = parts.hostname or ""
        port = parts.port or (443 if parts.scheme == "https" else 80)
        timeout = ATTEMPT_TIMEOUT
        if deadline is not None:
            timeout = max(0.0, min(timeout, deadline - time.monotonic()))
        try:
            async with asyncio.timeout(timeout):
                addresses = await _resolve(host, port)
                if not addresses:
                    return "retried", f"{host} resolved to no address"
                refusal = self.allow.refusal(host, addresses)
                if refusal is not None:
                    return "refused", f"{refusal}: not in --webhook-allow"
                body = jsoncodec.dumps(
                    {
                        "type": delivery.type,
                        "timestamp": _rfc3339(delivery.at),
                        "data": delivery.data,
                    }
                )
                status = await self._post(delivery, host, addresses, body)
        except TimeoutError:
            return "retried", f"no answer within {timeout:g} s"
        except (httpx.InvalidURL, UnicodeError) as exc:  # no resolver or client takes it
            return "gave_up", f"it can never be delivered: {_reason(exc)}"
        except Exception as exc:  # a connection, a resolver, anything else: maybe later
            return "retried", _reason(exc)
        if 200 <= status < 300:
            return "delivered", f"HTTP {status}"
        if 400 <= status < 500 and status not in (408, 429):
            return "gave_up", f"HTTP {status}"
        return "retried", f"HTTP {status}"

    async def _post(
        self, delivery: Delivery, host: str, addresses: list[_Address], body: bytes
    ) -> int:
        """POST to the addresses just checked, in the resolver's order until one connects:
        the connection goes to a checked address (never to what a second lookup might say),
        while `Host`, TLS's server name and the certificate check keep the URL's host. The
        answer's status; of its body at most MAX_RESPONSE_BYTES are read."""
        assert self._client is not None, "start() first"
        url = httpx.URL(delivery.url)
        headers = self.headers(delivery, body)
        headers.append(("host", url.netloc.decode("ascii").rpartition("@")[2]))
        failure: httpx.ConnectError | None = None
        for address in dict.fromkeys(addresses):
            try:
                async with self._client.stream(
                    "POST",
                    url.copy_with(host=str(address)),
                    content=body,
                    headers=headers,
                    extensions={"sni_hostname": host},
                ) as answer:
                    await _drain(answer, MAX_RESPONSE_BYTES)
                    return answer.status_code
            except httpx.ConnectError as exc:
                failure = exc
        assert failure is not None
        raise failure

    def headers(self, delivery: Delivery, body: bytes) -> list[tuple[str, str]]:
        """The Standard Webhooks headers for this attempt (signed now), then the extra
        ones: the place where headers are added to a webhook request."""
        now = datetime.fromtimestamp(int(time.time()), UTC)
        signature = self.signer.sign(delivery.delivery_id, now, body.decode())
        return [
            ("content-type", "application/json"),
            ("user-agent", self.user_agent),
            ("webhook-id", delivery.delivery_id),
            ("webhook-timestamp", str(int(now.timestamp()))),
            ("webhook-signature", signature),
            *self.extra_headers(delivery),
        ]

    async def flush(self, deadline: float) -> int:
        """At shutdown: stop claiming; attempts under way get until `deadline` (monotonic).
        With a store in this process, every delivery still owed gets one last attempt by
        then; returns those left undelivered (none with a shared store: other replicas
        deliver them)."""
        if self._task is None:
            return 0
        self._task.cancel()
        await asyncio.gather(self._task, return_exceptions=True)
        if not self.store.shared:
            _, owed = await self.store.claim_webhooks(2**31 - 1, CLAIM_LEASE, due_only=False)
            for delivery in owed:
                self._launch(delivery, deadline)
        if self._attempts:
            _, late = await asyncio.wait(
                set(self._attempts), timeout=max(0.0, deadline - time.monotonic())
            )
            for task in late:
                task.cancel()
            if late:  # a cancelled attempt ends at once; its claim lapses for another replica
                await asyncio.wait(late, timeout=0.1)
        if self.store.shared:
            return 0
        left, _ = await self.store.claim_webhooks(0, CLAIM_LEASE)
        self._set_pending(left)
        if left:
            logger.warning(
                "%s still owed at shutdown: undelivered",
                counted(left, "webhook delivery", "webhook deliveries"),
            )
        return left

    async def close(self) -> None:
        """Stop (after `flush`, or without it) and close the connections."""
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)
        for task in list(self._attempts):
            task.cancel()
        if self._attempts:
            await asyncio.wait(set(self._attempts), timeout=0.5)
        if self._client is not None:
            await self._client.aclose()
            self._client = None


async def _resolve(host: str, port: int) -> list[_Address]:
    """Every address the host names (an address names itself)."""
    try:
        return [ipaddress.ip_address(host)]
    except ValueError:
        pass
    found = await asyncio.get_running_loop().getaddrinfo(host, port, type=socket.SOCK_STREAM)
    return [ipaddress.ip_address(str(info[4][0]).split("%", 1)[0]) for info in found]


def _rfc3339(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp, UTC).strftime("%Y-%m-%dT%H:%M:%S.%fZ")


async def _drain(answer: httpx.Response, limit: int) -> None:
    """Read the answer's body (raw: nothing is decompressed) until its end or `limit`
    bytes; what is left is never read, and closing the answer closes its connection."""
    read = 0
    async for chunk in answer.aiter_raw():
        read += len(chunk)
        if read >= limit:
            return


def _reason(exc: BaseException) -> str:
    """An exception as a log line's reason: its type and message, bounded."""
    return f"{type(exc).__name__}: {exc}"[:200]


__all__ = [
    "ATTEMPT_TIMEOUT",
    "CLAIM_LEASE",
    "MAX_RESPONSE_BYTES",
    "OUTCOMES",
    "AllowList",
    "WebhookObserver",
    "WebhookSender",
    "check_secret",
    "check_url",
    "first_retry_delay",
    "host_problem",
    "read_secret_file",
    "retry_delay",
]
