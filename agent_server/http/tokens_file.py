"""`--api-tokens-file`: the tokens file, re-read when the mounted file changes.

Kubernetes updates a mounted Secret by swapping a symlink, so the file's identity (device,
inode), size and times change; a `stat` at most every `CHECK_INTERVAL` seconds, taken by the
request that finds the interval over, notices it, and the file is read and parsed again then.
A request after the change therefore meets the new tokens within that interval, well inside
the 10 s docs/security.md promises, and no request waits on anything but one `stat` a second.

A file that cannot be read or parsed keeps the tokens read last and logs one WARNING line
naming the line and the reason (never a line's text: it holds a token), once per change.
"""

from __future__ import annotations

import logging
import os
import time

from agent_server.model.counts import counted
from agent_server.model.principal import Principal
from agent_server.model.tokens import TokenError
from agent_server.model.tokens_file import TokenTable, read_tokens_file

logger = logging.getLogger("agent_server.auth")

#: Seconds between two looks at the file at most.
CHECK_INTERVAL = 1.0

#: What tells one version of the file from another without reading it.
Signature = tuple[int, int, int, int, int] | str


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
