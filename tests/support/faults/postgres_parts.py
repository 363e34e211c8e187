"""The Postgres under the fault harness's replicas (tests/support/faults/), and its faults.

A primary and one SYNCHRONOUS streaming standby (`synchronous_standby_names = '*'`: a commit
returns once the standby has flushed it), each a real `postgres` of Debian's package run as
the unprivileged `postgres` user on a loopback port of its own (tests/support/postgres_server.py),
the standby made by `pg_basebackup` of the primary. Each node has a `CutProxy` in front of it;
the replicas reach both proxies with one multi-host URL,
`postgresql://agent:...@127.0.0.1:P1,127.0.0.1:P2/agents?target_session_attrs=read-write`,
so libpq finds whichever node is the primary now. A cut parts the replicas from both nodes
while replication (over the data directory's socket) goes on, as a partition between pods and
the database does.

The faults: kill -9 of the primary (its whole process group: the postmaster and every
backend) and its restart on its data, where it recovers and stays the primary; SIGSTOP and
SIGCONT of the same group (a pause: connections open, nothing answers); a cut of both proxies
(refused or reset); and a failover as Patroni makes one: the standby in sync first, the old
primary fenced (a fast shutdown), the standby promoted (`pg_ctl promote`), and the old one
re-seeded from the new primary by `pg_basebackup` as its synchronous standby. Until the
re-seeded standby streams, the new primary commits alone (`synchronous_standby_names` empty,
as Patroni's non-strict `synchronous_mode` does): no fault strikes in that window, and the next
failover waits for the standby to be in sync again.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from tests.support.faults.redis_parts import CutProxy, stable_port
from tests.support.postgres_server import (
    DATABASE,
    PASSWORD,
    ROLE,
    START_TIMEOUT,
    PostgresServer,
    _as_postgres,
    bindir,
)

#: Bound on the standby streaming in sync after a start, a restart, a failover or a heal.
SETTLE_WAIT = 60.0
#: Bound on one pg_basebackup, or one pg_ctl promote.
TOOL_TIMEOUT = 120.0


def _wait(predicate: Callable[[], Any], timeout: float) -> Any:
    """Poll `predicate` until it is truthy or `timeout` passed; its last value."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value or time.monotonic() > deadline:
            return value
        time.sleep(0.1)


class PgNode(PostgresServer):
    """One node, a primary or a standby, on a fixed port: its data in a short temporary
    directory (a socket's path has a bound), its log in the run's directory."""

    def __init__(self, name: str, log_path: Path) -> None:
        # Not PostgresServer.__init__: a standby is made by pg_basebackup, not initdb.
        self.name = name
        self.bin = bindir()
        self.port = stable_port()
        self.directory = Path(tempfile.mkdtemp(prefix=f"agent-server-faults-{name}-"))
        self.data = self.directory / "data"
        self.log_path = log_path
        self.proc: subprocess.Popen[bytes] | None = None
        self.as_user = _as_postgres()
        if self.as_user:
            os.chown(self.directory, self.as_user["user"], self.as_user["group"])

    def options(self) -> list[str]:
        return [
            *super().options(),
            *("-c", "wal_level=replica", "-c", "max_wal_senders=10", "-c", "hot_standby=on"),
            *("-c", "wal_keep_size=512MB", "-c", "max_replication_slots=10"),
            *("-c", f"cluster_name={self.name}"),
        ]

    def init_primary(self) -> None:
        """initdb, start, the store's role and database."""
        self._initdb()

    def tool(self, name: str, *args: str) -> str:
        """A Postgres client program run as the `postgres` user; its output (raises if it
        fails)."""
        done = subprocess.run(
            [str(self.bin / name), *args],
            capture_output=True,
            text=True,
            timeout=TOOL_TIMEOUT,
            cwd=self.directory,
            **self.as_user,
        )
        if done.returncode != 0:
            raise AssertionError(f"{name} {' '.join(args)} failed:\n{done.stdout}\n{done.stderr}")
        return str(done.stdout) + str(done.stderr)

    def init_standby(self, primary: PgNode) -> None:
        """A fresh base backup of `primary` (its data wiped first), started as its standby:
        `-R` writes `standby.signal` and the `primary_conninfo`, named by this node (the
        primary's `pg_stat_replication` shows that name)."""
        self.kill()
        shutil.rmtree(self.data, ignore_errors=True)
        source = (
            f"host={primary.data} port={primary.port} user=postgres application_name={self.name}"
        )
        self.tool(
            "pg_basebackup",
            *("-D", str(self.data), "-d", source, "-R", "-X", "stream", "-c", "fast", "--no-sync"),
        )
        self.start()

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def send(self, sig: int) -> None:
        """A signal to the postmaster and every backend (its process group)."""
        assert self.proc is not None
        os.killpg(self.proc.pid, sig)

    def query(self, sql: str) -> list[tuple[Any, ...]] | None:
        """Rows of one statement as the superuser, or None if the node does not answer."""
        import psycopg

        try:
            with psycopg.connect(self.admin_dsn(), autocommit=True, connect_timeout=2) as conn:
                cursor = conn.execute(sql)
                return list(cursor.fetchall()) if cursor.description else []
        except psycopg.Error:
            return None

    def in_recovery(self) -> bool | None:
        rows = self.query("SELECT pg_is_in_recovery()")
        return None if not rows else bool(rows[0][0])

    def set_sync(self, names: str) -> None:
        """`synchronous_standby_names` (ALTER SYSTEM, reloaded)."""
        self.admin(
            f"ALTER SYSTEM SET synchronous_standby_names = '{names}'", "SELECT pg_reload_conf()"
        )

    def fast_stop(self) -> int | None:
        """A fast shutdown (SIGINT), waited for; its exit code, or None if killed."""
        assert self.proc is not None
        self.proc.send_signal(signal.SIGINT)
        code: int | None
        try:
            code = self.proc.wait(timeout=START_TIMEOUT)
        except subprocess.TimeoutExpired:
            self.kill()
            code = None
        self.proc = None
        return code


class PostgresPair:
    """A primary and its synchronous standby, a CutProxy in front of each:
    `--store postgresql://agent:...@<proxy 1>,<proxy 2>/agents?target_session_attrs=read-write`."""

    kinds: tuple[str, ...] = ("pause-postgres", "kill-postgres", "cut", "failover-postgres")

    def __init__(self, directory: Path) -> None:
        (directory / "postgres").mkdir()
        self.nodes = [PgNode(f"pg{i}", directory / "postgres" / f"pg{i}.log") for i in range(2)]
        self.proxies = [CutProxy(node.port) for node in self.nodes]
        self.primary_index = 0
        self.failovers = 0

    @property
    def primary(self) -> PgNode:
        return self.nodes[self.primary_index]

    @property
    def standby(self) -> PgNode:
        return self.nodes[1 - self.primary_index]

    def open(self) -> None:
        self.primary.init_primary()
        self.standby.init_standby(self.primary)
        self.primary.set_sync("*")
        unsettled = self.settle()
        assert unsettled is None, unsettled
        for proxy in self.proxies:
            proxy.start()

    @property
    def url(self) -> str:
        hosts = ",".join(f"127.0.0.1:{proxy.port}" for proxy in self.proxies)
        return f"postgresql://{ROLE}:{PASSWORD}@{hosts}/{DATABASE}?target_session_attrs=read-write"

    def in_sync(self) -> bool:
        """The primary answers as one, and the standby streams to it synchronously."""
        if self.primary.in_recovery() is not False:
            return False
        rows = self.primary.query(
            "SELECT application_name FROM pg_stat_replication "
            "WHERE state = 'streaming' AND sync_state = 'sync'"
        )
        return rows is not None and any(row[0] == self.standby.name for row in rows)

    def settle(self, timeout: float = SETTLE_WAIT) -> str | None:
        """Wait (bounded) until the standby streams in sync; what is not so, or None."""
        if _wait(self.in_sync, timeout):
            return None
        return f"not in sync after {timeout:g}s: {self.describe()}"

    def pause(self) -> tuple[PgNode, str]:
        node = self.primary
        return node, f"{node.name} :{node.port} primary"

    def kill_restart(self) -> str:
        """kill -9 of the primary's process group, then a start on its data (crash recovery;
        it stays the primary, the standby reconnects)."""
        node = self.primary
        node.kill()
        node.start()
        return f"{node.name} :{node.port} killed and restarted; {self.settle() or 'in sync'}"

    def failover(self) -> str:
        """As Patroni: the standby in sync first; the old primary fenced (fast shutdown),
        the standby promoted and left to commit alone, the old one re-seeded from it by
        pg_basebackup as its standby; then synchronous again."""
        unsettled = self.settle()
        old, new = self.primary, self.standby
        code = old.fast_stop()
        new.set_sync("")  # a file setting: a standby takes it, and keeps it once promoted
        new.tool("pg_ctl", "promote", "-D", str(new.data), "-w", "-t", str(int(TOOL_TIMEOUT)))
        self.primary_index = 1 - self.primary_index
        self.failovers += 1
        promoted = _wait(lambda: new.in_recovery() is False, START_TIMEOUT)
        began = time.monotonic()
        try:
            old.init_standby(new)
            reseeded = f"{old.name} re-seeded in {time.monotonic() - began:.1f}s"
        except AssertionError as exc:
            reseeded = f"{old.name} not re-seeded: {str(exc)[:400]}"
        new.set_sync("*")
        return (
            f"{old.name} :{old.port} stopped (exit {code}); {new.name} :{new.port} "
            + ("promoted" if promoted else "not promoted in time")
            + f"; {reseeded}; {self.settle() or 'in sync'}"
            + (f"; before: {unsettled}" if unsettled else "")
        )

    def cut(self, mode: str) -> None:
        for proxy in self.proxies:
            proxy.cut(mode)

    def restore(self) -> None:
        for proxy in self.proxies:
            proxy.restore()

    def heal(self) -> str | None:
        """Both nodes running and not stopped (a standby that is not starts from a fresh
        base backup), both proxies open; then in sync (bounded)."""
        for node in self.nodes:
            if node.running():
                with contextlib.suppress(OSError):
                    node.send(signal.SIGCONT)
        if not self.primary.running():
            self.primary.start()
        if not self.standby.running():
            try:
                self.standby.init_standby(self.primary)
            except AssertionError as exc:
                return f"standby not re-seeded: {str(exc)[:400]}"
        self.restore()
        return self.settle()

    def describe(self) -> str:
        def role(node: PgNode) -> str:
            if not node.running():
                return "down"
            recovery = node.in_recovery()
            return "silent" if recovery is None else ("standby" if recovery else "primary")

        rows = self.primary.query(
            "SELECT application_name, state, sync_state FROM pg_stat_replication"
        )
        nodes = ", ".join(f"{node.name} :{node.port} {role(node)}" for node in self.nodes)
        return f"{nodes}; the primary {self.primary.name} streams to {rows}"

    def close(self) -> None:
        for proxy in self.proxies:
            proxy.stop()
        for node in self.nodes:
            if node.running():
                with contextlib.suppress(OSError):
                    node.send(signal.SIGCONT)
            node.kill()
            shutil.rmtree(node.directory, ignore_errors=True)
