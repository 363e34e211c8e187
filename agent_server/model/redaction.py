"""What a log line may show: one rule for URLs, and text a client chose kept to one line.

A web URL (http, https, ws, wss) often carries a receiver's secret: in its userinfo, its
query (`?token=`) or its path (Slack's `/services/T000/B000/XXXX`, Discord's
`/api/webhooks/ID/TOKEN`, Teams' `/webhookb2/...`, webhook.site's `/<uuid>`). Every log
line this process writes shows one as `scheme://host[:port]`, an IPv6 host in brackets,
followed by `/…` when it had a path, query or fragment: the host and port say which
receiver it is, and nothing after them is shown. A URL of another scheme (the store's
`redis://`) loses its userinfo only. `RedactUrls`, a logging filter on the handlers the
server installs and on httpx's logger, applies the rule to every message, traceback and
JSON field, the HTTP library's own lines included. docs/observability.md#what-a-line-shows.
"""

from __future__ import annotations

import logging
import re
import time
from collections.abc import Callable
from urllib.parse import urlsplit

#: The schemes whose path and query are never shown.
WEB_SCHEMES = frozenset({"http", "https", "ws", "wss"})
#: Shown in place of a path, query or fragment.
ELIDED = "/…"
#: A URL as it appears in running text: a scheme, `://`, and what follows up to a space,
#: a quote or an angle bracket.
_URL = re.compile(r"\b([A-Za-z][A-Za-z0-9+.-]{0,31})://([^\s\"'`<>]*)")
#: Characters that would end or bend a line of text: C0 and C1 controls, DEL, and Unicode's
#: line and paragraph separators.
_CONTROLS = re.compile("[\x00-\x1f\x7f-\x9f\u2028\u2029]")


def shown_url(url: str) -> str:
    """`url` as a log line may show it (the module's rule); never raises."""
    scheme, sep, rest = url.partition("://")
    if not sep:
        return url
    if scheme.lower() not in WEB_SCHEMES:
        netloc, slash, tail = rest.partition("/")
        return f"{scheme}://{netloc.rpartition('@')[2]}{slash}{tail}"
    try:
        parts = urlsplit(url)
        host = parts.hostname or ""
    except ValueError:  # an unbalanced bracket: nothing of it is shown
        return f"{scheme.lower()}://{ELIDED[1:]}"
    try:
        port = parts.port
    except ValueError:  # a port that is not a number
        port = None
    if ":" in host:
        host = f"[{host}]"
    where = f"{scheme.lower()}://{host}" + ("" if port is None else f":{port}")
    if parts.path in ("", "/") and not parts.query and not parts.fragment:
        return where + parts.path
    return where + ELIDED


def redact_urls(text: str) -> str:
    """Every URL in `text` replaced by what a log line may show of it."""
    if "://" not in text:
        return text
    return _URL.sub(lambda found: shown_url(found.group(0)), text)


def one_line(text: str) -> str:
    """`text` with every character that could end or bend a line escaped (`\\r`, `\\n`,
    `\\x1b`, `\\u2028`), so what a client chose can never start a line of its own."""
    if _CONTROLS.search(text) is None:
        return text
    return _CONTROLS.sub(_escape, text)


def quoted(text: str, limit: int) -> str:
    """`text` quoted for a log line: at most `limit` characters of it, escaped to one line,
    and its length when it was longer."""
    if len(text) <= limit:
        return repr(text)
    return f"{text[:limit]!r}… ({len(text)} chars)"


def _escape(found: re.Match[str]) -> str:
    char = found.group(0)
    return {"\r": "\\r", "\n": "\\n", "\t": "\\t"}.get(char) or (
        f"\\x{ord(char):02x}" if ord(char) < 0x100 else f"\\u{ord(char):04x}"
    )


class RedactUrls(logging.Filter):
    """Renders a record's message once, with every URL shown by the rule, and so its
    traceback and the text values of its `fields` (the JSON line's keys).

    On a handler it sees every record the handler writes, whichever logger made it; on a
    logger (httpx's), every record made there, whoever handles it."""

    def filter(self, record: logging.LogRecord) -> bool:
        record.msg, record.args = redact_urls(record.getMessage()), None
        if record.exc_info and not record.exc_text:
            record.exc_text = logging.Formatter().formatException(record.exc_info)
        if record.exc_text:
            record.exc_text = redact_urls(record.exc_text)
        fields = getattr(record, "fields", None)
        if isinstance(fields, dict) and any(
            isinstance(value, str) and "://" in value for value in fields.values()
        ):
            record.fields = {
                key: redact_urls(value) if isinstance(value, str) else value
                for key, value in fields.items()
            }
        return True


class QuoteArgs(logging.Filter):
    """On the logger of a library that puts what a client sent into its lines (the W3C
    baggage propagator: a malformed `baggage` header, up to the whole head, and a line per
    malformed entry): each text argument quoted and cut to `limit` characters, and at most
    `per_second` lines a second; the next line let through counts those dropped."""

    def __init__(
        self, limit: int, per_second: int = 10, clock: Callable[[], float] = time.monotonic
    ) -> None:
        super().__init__()
        self.limit = limit
        self.per_second = per_second
        self.clock = clock
        self._window = -1.0
        self._passed = 0
        self._dropped = 0

    def filter(self, record: logging.LogRecord) -> bool:
        now = self.clock()
        if now - self._window >= 1.0:
            self._window, self._passed = now, 0
        if self._passed >= self.per_second:
            self._dropped += 1
            return False
        self._passed += 1
        if isinstance(record.args, tuple):
            record.args = tuple(
                quoted(arg, self.limit) if isinstance(arg, str) else arg for arg in record.args
            )
        if self._dropped:
            record.msg = f"{record.msg} ({self._dropped} such lines dropped before this one)"
            self._dropped = 0
        return True


def install(target: logging.Handler | logging.Logger, made: logging.Filter) -> None:
    """Add `made` to `target` unless a filter of its class is there already."""
    if not any(type(found) is type(made) for found in target.filters):
        target.addFilter(made)


__all__ = ["QuoteArgs", "RedactUrls", "install", "one_line", "quoted", "redact_urls", "shown_url"]
