"""Checks of settings whose rules are longer than a field's: the store URL and the CORS
origins, each refused at start with one line (exit 2) that quotes no secret."""

from __future__ import annotations

from urllib.parse import urlsplit


def check_store_url(url: str) -> None:
    """`--store`: memory, or a Redis URL (Sentinel's included) that parses."""
    if url.lower().startswith("redis+sentinel://"):
        from agent_server.store.sentinel import parse_url  # redis-py only when asked for

        parse_url(url)  # a malformed one fails the start; its message omits the password
        return
    if url == "memory":
        return
    # Parsed here, so a malformed URL stops the start with one line (exit 2) that never
    # echoes a piece of it: with '#', '?' or '/' in a password, the parsers' own messages
    # quote what they took for the port, which is the password.
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises for a port that is not a number
    except ValueError:
        raise ValueError(
            "store URL is malformed (a password with '#', '?', '/' or '@' must be percent-encoded)"
        ) from None
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ValueError("store must be memory, or a redis://, rediss:// or redis+sentinel:// URL")
    if parts.scheme != "unix" and not parts.hostname:
        raise ValueError("store URL names no host")
    database = parts.path.lstrip("/")
    if database and not database.isdigit():
        raise ValueError("store URL's database must be a number (redis://host:6379/0)")


def check_origins(value: tuple[str, ...]) -> tuple[str, ...]:
    """`--cors-allow-origin`: an origin is what a browser sends in `Origin`,
    scheme://host[:port], nothing after it. A path or a trailing slash would match no
    request, silently."""
    for origin in value:
        if origin == "*":
            continue
        try:
            parts = urlsplit(origin)
            parts.port  # noqa: B018 - raises for a port that is not a number
        except ValueError:
            raise ValueError(f"cors-allow-origin {origin!r} is not an origin") from None
        if (
            parts.scheme not in ("http", "https")
            or not parts.hostname
            or parts.path
            or parts.query
            or parts.fragment
            or "@" in parts.netloc
        ):
            raise ValueError(
                f"cors-allow-origin {origin!r} is not an origin: give "
                "scheme://host[:port] with nothing after it (https://app.example.com), or *"
            )
    return value
