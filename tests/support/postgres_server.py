"""A real PostgreSQL child process on a free loopback port, for the store tests.

No fake database: the postgres store is tested against the server it will run against,
Debian's `postgresql` package (its binaries in /usr/lib/postgresql/<version>/bin, off
PATH). Postgres refuses to run as root, so when the tests run as root (here and in CI)
`initdb` and `postgres` run as the unprivileged `postgres` user the package creates, in a
temporary directory that user owns. The store connects as an ordinary role with a password
that owns its database (never a superuser), over TCP on 127.0.0.1. Every wait is bounded;
`stop` and `start` again on the same port and directory bring the same data back (an
outage, not a loss); `kill` is kill -9.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

from tests.support.process import free_port, unavailable

#: Seconds to wait for the server to accept connections, or to exit.
START_TIMEOUT = 20.0
#: The store's role, its password and its database (the role owns it).
ROLE, PASSWORD, DATABASE = "agent", "s3cret-pg", "agents"


def bindir() -> Path:
    """Where `initdb` and `postgres` are: `pg_config --bindir`, or Debian's directory."""
    found = shutil.which("pg_config")
    if found is not None:
        out = subprocess.run([found, "--bindir"], capture_output=True, text=True, timeout=10)
        candidate = Path(out.stdout.strip())
        if (candidate / "initdb").exists():
            return candidate
    for path in sorted(glob.glob("/usr/lib/postgresql/*/bin"), reverse=True):
        if (Path(path) / "initdb").exists():
            return Path(path)
    unavailable("needs PostgreSQL's initdb and postgres (apt-get install postgresql)")


def _as_postgres() -> dict[str, Any]:
    """Popen's arguments that run a command as the unprivileged `postgres` user when we are
    root (the process itself, no `runuser` between: signals reach the postmaster)."""
    if os.geteuid() != 0:
        return {}
    try:
        entry = pwd.getpwnam("postgres")
    except KeyError:
        unavailable("running as root needs the `postgres` user (apt-get install postgresql)")
    return {"user": entry.pw_uid, "group": entry.pw_gid, "extra_groups": []}


class PostgresServer:
    """`postgres` bound to 127.0.0.1 on a port of its own, with one database for the store."""

    def __init__(self, port: int | None = None) -> None:
        self.bin = bindir()
        self.port = port or free_port()
        self.directory = Path(tempfile.mkdtemp(prefix="agent-server-pg-"))
        self.data = self.directory / "data"
        self.log_path = self.directory / "postgres.log"
        self.proc: subprocess.Popen[bytes] | None = None
        self.as_user = _as_postgres()
        if self.as_user:
            os.chown(self.directory, self.as_user["user"], self.as_user["group"])
        self._initdb()

    @property
    def url(self) -> str:
        """The store's URL: its own role and database, with the password."""
        return f"postgresql://{ROLE}:{PASSWORD}@127.0.0.1:{self.port}/{DATABASE}"

    def admin_dsn(self, database: str = "postgres") -> str:
        """The superuser's connection, over the data directory's socket (trusted): for
        the fixture's own setup and for tests that look behind the store's back."""
        return f"host={self.data} port={self.port} user=postgres dbname={database}"

    def _initdb(self) -> None:
        command = [
            str(self.bin / "initdb"),
            *("-D", str(self.data), "-U", "postgres", "-E", "UTF8", "--locale=C"),
            *("--auth-local=trust", "--auth-host=scram-sha-256", "--no-sync"),
        ]
        done = subprocess.run(
            command, capture_output=True, text=True, timeout=60, cwd=self.directory, **self.as_user
        )
        if done.returncode != 0:
            raise AssertionError(f"initdb failed:\n{done.stdout}\n{done.stderr}")
        self.start()
        self.admin(
            f"CREATE ROLE {ROLE} LOGIN PASSWORD '{PASSWORD}'",
            f"CREATE DATABASE {DATABASE} OWNER {ROLE}",
        )

    def options(self) -> list[str]:
        """The postmaster's arguments (a subclass adds its own settings)."""
        return [
            *("-D", str(self.data), "-p", str(self.port)),
            *("-c", "listen_addresses=127.0.0.1", "-c", f"unix_socket_directories={self.data}"),
            *("-c", "fsync=off", "-c", "max_connections=200", "-c", "logging_collector=off"),
        ]

    def start(self) -> None:
        """Start it and wait (bounded) until it accepts connections."""
        command = [str(self.bin / "postgres"), *self.options()]
        log = self.log_path.open("ab")
        self.proc = subprocess.Popen(
            command,
            stdout=log,
            stderr=log,
            start_new_session=True,
            cwd=self.directory,
            **self.as_user,
        )
        log.close()
        deadline = time.monotonic() + START_TIMEOUT
        while not self.ready():
            if self.proc.poll() is not None:
                raise AssertionError(f"postgres exited early:\n{self.log()}")
            if time.monotonic() > deadline:
                self.kill()
                raise AssertionError(f"postgres silent for {START_TIMEOUT}s:\n{self.log()}")
            time.sleep(0.05)

    def ready(self) -> bool:
        import psycopg

        try:
            with psycopg.connect(self.admin_dsn(), connect_timeout=1) as conn:
                conn.execute("SELECT 1")
            return True
        except psycopg.Error:
            return False

    def admin(self, *statements: str, database: str = "postgres") -> list[object]:
        """Run statements as the superuser (autocommit); the last one's rows."""
        import psycopg

        rows: list[object] = []
        with psycopg.connect(self.admin_dsn(database), autocommit=True, connect_timeout=5) as conn:
            for statement in statements:
                cursor = conn.execute(statement)
                rows = list(cursor.fetchall()) if cursor.description else []
        return rows

    def reset(self) -> None:
        """An empty database for the next test: dropped and made again (the store's role
        owns it), its connections ended first."""
        self.admin(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            f"WHERE datname = '{DATABASE}' AND pid <> pg_backend_pid()",
            f"DROP DATABASE IF EXISTS {DATABASE} WITH (FORCE)",
            f"CREATE DATABASE {DATABASE} OWNER {ROLE}",
        )

    def stop(self) -> None:
        """A fast shutdown (SIGINT), waited for; its data stays for `start`."""
        if self.proc is None:
            return
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(timeout=START_TIMEOUT)
            except subprocess.TimeoutExpired:
                self.kill()
        self.proc = None

    def pause(self) -> None:
        """SIGSTOP of the postmaster and every backend: connections stay open, nothing
        answers (SIGKILL still ends them)."""
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        os.killpg(self.proc.pid, signal.SIGCONT)

    def kill(self) -> None:
        """kill -9 of the postmaster and every backend (its process group)."""
        if self.proc is not None and self.proc.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
                os.killpg(self.proc.pid, signal.SIGCONT)
            self.proc.wait(timeout=START_TIMEOUT)
        self.proc = None
        # Backends orphaned by the kill leave at once with their postmaster gone; a stale
        # postmaster.pid is removed by the next start itself.

    def remove(self) -> None:
        """Stop it and delete its directory."""
        self.kill()
        shutil.rmtree(self.directory, ignore_errors=True)

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-4000:]
        except OSError:
            return ""
