"""The API token as configured: what a token may be, and reading one from a mounted file.

Checked where settings are read, before any request: a token HTTP would strip or mangle
could never match one (`authenticators.py` compares them).
"""

from __future__ import annotations

from pathlib import Path

#: Longest token accepted in settings; far beyond any generated secret.
MAX_TOKEN_LENGTH = 4096


class TokenError(ValueError):
    """A configured token that could never match a request, or a token file we cannot use."""


def check_token(token: str) -> str:
    """A token must be visible ASCII without spaces: HTTP strips or mangles anything else."""
    if not 0 < len(token) <= MAX_TOKEN_LENGTH:
        raise TokenError(f"api token must be 1 to {MAX_TOKEN_LENGTH} characters")
    if not all("!" <= char <= "~" for char in token):
        raise TokenError("api token must be printable ASCII without spaces")
    return token


def read_token_file(path: str) -> str:
    """The secret in a mounted file (a Kubernetes secret volume), trailing newline stripped."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else type(exc).__name__
        raise TokenError(f"api token file {path!r} cannot be read: {reason}") from None
    token = text.rstrip("\r\n")
    if not token:
        raise TokenError(f"api token file {path!r} is empty")
    return check_token(token)
