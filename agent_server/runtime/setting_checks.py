"""Checks of settings whose rules are longer than a field's (the store URL's is
store/urls.py), each refused at start with one line (exit 2) that quotes no secret."""

from __future__ import annotations

from urllib.parse import urlsplit


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
