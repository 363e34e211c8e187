"""`--store` as the settings check it: memory, a Redis URL (plain, TLS, a unix socket or
Sentinel) or a Postgres URL; a malformed one stops the start with one line (exit 2) that
never echoes a piece of it."""

from __future__ import annotations

from urllib.parse import urlsplit


def check_store_url(url: str) -> None:
    """Raise ValueError (a message without the URL) for a store URL no store takes."""
    if url.lower().startswith("redis+sentinel://"):
        from agent_server.store.redis.sentinel import parse_url  # redis-py only when asked for

        parse_url(url)  # a malformed one fails the start; its message omits the password
        return
    if url == "memory":
        return
    if url.startswith(("postgresql://", "postgres://")):
        return  # libpq reads it (several hosts, parameters) and names what it refuses
    # With '#', '?' or '/' in a password, the parsers' own messages quote what they took
    # for the port, which is the password: the message here is ours.
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises for a port that is not a number
    except ValueError:
        raise ValueError(
            "store URL is malformed (a password with '#', '?', '/' or '@' must be percent-encoded)"
        ) from None
    if parts.scheme not in ("redis", "rediss", "unix"):
        raise ValueError(
            "store must be memory, or a redis://, rediss://, redis+sentinel://, "
            "postgresql:// or postgres:// URL"
        )
    if parts.scheme != "unix" and not parts.hostname:
        raise ValueError("store URL names no host")
    database = parts.path.lstrip("/")
    if database and not database.isdigit():
        raise ValueError("store URL's database must be a number (redis://host:6379/0)")
