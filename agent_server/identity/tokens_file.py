"""The tokens file of `--api-tokens-file`: one principal per bearer token.

One line per token, `token identity [tenant] [scope,...]`, fields apart by spaces or tabs;
`-` for the tenant means the identity's own; a line whose first visible character is `#` is a
comment, an empty line is skipped. A file that breaks any rule is refused whole, by line
number and reason: a message never quotes a line, which holds a token.

Only SHA-256 digests of the tokens are kept, so a lookup compares digests (its time says
nothing about the token) and no token stays in memory as text.

The server follows the file (`TokensFile`): Kubernetes updates a mounted Secret by swapping a
symlink, so the file's identity (device, inode), size and times change; a `stat` at most every
`CHECK_INTERVAL` seconds, taken by the request that finds the interval over, notices it, and
the file is read and parsed again then. A request after the change therefore meets the new
tokens within that interval, well inside the 10 s docs/security.md promises, and no request
waits on anything but one `stat` a second. A file that cannot be read or parsed keeps the
tokens read last and logs one WARNING line naming the line and the reason (never a line's
text: it holds a token), once per change.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from agent_server.identity.principal import Principal, check_name, check_tenant
from agent_server.identity.tokens import TokenError, check_token
from agent_server.model.counts import counted

logger = logging.getLogger("agent_server.auth")

#: Largest tokens file read (about ten thousand tokens); past it the file is refused.
MAX_TOKENS_FILE_BYTES = 1024 * 1024
#: The tenant field that means "the identity's own tenant", to give scopes without a tenant.
OWN_TENANT = "-"
#: Fields are apart by spaces and tabs only: Python's own whitespace includes separators
#: (\x1c to \x1f, \x85, \u2028) a token must not hide.
_FIELDS = re.compile(r"[ \t]+")

#: Seconds between two looks at the file at most.
CHECK_INTERVAL = 1.0

#: What tells one version of the file from another without reading it.
Signature = tuple[int, int, int, int, int] | str


def token_digest(token: bytes) -> bytes:
    """The key a token is kept and looked up under."""
    return hashlib.sha256(token).digest()


@dataclass(frozen=True)
class TokenTable:
    """The principals of a tokens file, by the digest of their token."""

    principals: Mapping[bytes, Principal]

    def __len__(self) -> int:
        return len(self.principals)

    def find(self, token: bytes) -> Principal | None:
        return self.principals.get(token_digest(token))


def parse_tokens(text: str, source: str = "tokens file") -> TokenTable:
    """The table a tokens file's text gives, or TokenError naming the first bad line."""
    found: dict[bytes, Principal] = {}
    first_line: dict[bytes, int] = {}
    for number, raw in enumerate(text.removeprefix("\ufeff").split("\n"), start=1):
        line = raw.removesuffix("\r").strip(" \t")
        if not line or line.startswith("#"):
            continue
        fields = _FIELDS.split(line)
        where = f"{source} line {number}"
        if len(fields) < 2:
            raise TokenError(f"{where}: needs a token and an identity")
        if len(fields) > 4:
            raise TokenError(
                f"{where}: has {len(fields)} fields, at most 4 (token identity [tenant] "
                "[scope,...])"
            )
        token, identity, *rest = fields
        try:
            check_token(token)
        except TokenError as exc:
            raise TokenError(f"{where}: {exc}") from None
        tenant = rest[0] if rest else OWN_TENANT
        scopes = rest[1].split(",") if len(rest) > 1 else []
        try:
            check_name(identity, "the identity")
            if tenant != OWN_TENANT:
                check_tenant(tenant, "the tenant")
            for scope in scopes:
                check_name(scope, "each scope")
        except ValueError as exc:
            raise TokenError(f"{where}: {exc}") from None
        digest = token_digest(token.encode("ascii"))
        if digest in found:
            raise TokenError(f"{where}: repeats the token of line {first_line[digest]}")
        first_line[digest] = number
        found[digest] = Principal(
            identity, None if tenant == OWN_TENANT else tenant, frozenset(scopes)
        )
    if not found:
        raise TokenError(f"{source} holds no token")
    return TokenTable(found)


def read_tokens_file(path: str) -> TokenTable:
    """The table of the file at `path` (bounded in size), or TokenError saying why not."""
    source = f"tokens file {path!r}"
    try:
        with Path(path).open("rb") as handle:
            data = handle.read(MAX_TOKENS_FILE_BYTES + 1)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise TokenError(f"{source} cannot be read: {reason}") from None
    if len(data) > MAX_TOKENS_FILE_BYTES:
        raise TokenError(f"{source} is larger than {MAX_TOKENS_FILE_BYTES} bytes")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError:
        raise TokenError(f"{source} is not UTF-8 text") from None
    return parse_tokens(text, source)


def _signature(path: str) -> Signature:
    try:
        found = os.stat(path)
    except OSError as exc:
        return f"cannot be read: {exc.strerror or type(exc).__name__}"
    return (found.st_dev, found.st_ino, found.st_size, found.st_mtime_ns, found.st_ctime_ns)


class TokensFile:
    """The principals of a tokens file, by token, following the file as it changes."""

    def __init__(self, path: str) -> None:
        self.path = path
        self._signature = _signature(path)
        # The settings read it already, so a file bad at start has stopped the start.
        self.table: TokenTable = read_tokens_file(path)
        self._checked_at = time.monotonic()

    def find(self, token: bytes) -> Principal | None:
        now = time.monotonic()
        if now - self._checked_at >= CHECK_INTERVAL:
            self._checked_at = now
            self._follow()
        return self.table.find(token)

    def _follow(self) -> None:
        signature = _signature(self.path)
        if signature == self._signature:
            return
        self._signature = signature
        try:
            table = read_tokens_file(self.path)
        except TokenError as exc:
            logger.warning(
                "%s; the %s read before stay in force", exc, counted(len(self.table), "token")
            )
            return
        self.table = table
        logger.info("tokens file %r read again: %s", self.path, counted(len(table), "token"))
