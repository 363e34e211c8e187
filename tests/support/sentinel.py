"""A real `redis-sentinel` for the tests and the fault harness: its own configuration file
(it rewrites it), started on a port the caller picks, asked bounded questions."""

from __future__ import annotations

import subprocess
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import redis

#: Sentinel flags of a replica it would not promote.
DOWN = frozenset({"s_down", "o_down", "disconnected"})

CONFIG = """\
port {port}
bind 127.0.0.1
dir {dir}
logfile {log}
sentinel monitor {service} 127.0.0.1 {primary} {quorum}
sentinel down-after-milliseconds {service} {down_after}
sentinel failover-timeout {service} {failover_timeout}
sentinel parallel-syncs {service} 1
"""


class SentinelProcess:
    """One `redis-sentinel` watching `service`, whose primary is on `primary`."""

    def __init__(
        self,
        directory: Path,
        primary: int,
        *,
        service: str,
        port: int,
        password: str | None = None,
        quorum: int = 2,
        down_after_ms: int = 1000,
        failover_timeout_ms: int = 5000,
    ) -> None:
        directory.mkdir()
        self.service = service
        self.port = port
        self.log_path = directory / "sentinel.log"
        config = directory / "sentinel.conf"
        text = CONFIG.format(
            port=port,
            dir=directory,
            log=self.log_path,
            service=service,
            primary=primary,
            quorum=quorum,
            down_after=down_after_ms,
            failover_timeout=failover_timeout_ms,
        )
        if password is not None:
            text += f"sentinel auth-pass {service} {password}\n"
        config.write_text(text)
        self.proc = subprocess.Popen(
            ["redis-sentinel", str(config)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
        )
        self.client = redis.Redis(port=port, socket_timeout=1.0, decode_responses=True)

    def answers(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"redis-sentinel exited:\n{self.log()}")
        try:
            return bool(self.client.ping())
        except redis.RedisError:
            return False

    def ask(self, *command: str) -> Any:
        """One SENTINEL command; None when this sentinel does not answer."""
        try:
            return self.client.execute_command("SENTINEL", *command)
        except (redis.RedisError, OSError):
            return None

    def primary(self) -> tuple[str, int] | None:
        """Where it says the primary is, if it answers."""
        reply = self.ask("get-master-addr-by-name", self.service)
        if isinstance(reply, list | tuple) and len(reply) == 2:
            return str(reply[0]), int(reply[1])
        return None

    def knows(self, replicas: Iterable[int], sentinels: int) -> bool:
        """It sees every one of `replicas` up and `sentinels` other sentinels."""
        found = self.ask("replicas", self.service) or []
        others = self.ask("sentinels", self.service) or []
        up = {int(r["port"]) for r in found if "s_down" not in r["flags"]}
        return set(replicas) <= up and len(others) == sentinels

    def sees_replica(self, replica: int, primary: int) -> bool:
        """It knows `replica` as an up replica of `primary` with its link up."""
        for found in self.ask("replicas", self.service) or []:
            if int(found["port"]) == replica:
                return (
                    int(found.get("master-port") or 0) == primary
                    and found.get("master-link-status") == "ok"
                    and not DOWN & set(found["flags"].split(","))
                )
        return False

    def promotable(self) -> set[int]:
        """The ports of the replicas it could promote: seen up, priority not 0."""
        return {
            int(found["port"])
            for found in self.ask("replicas", self.service) or []
            if not DOWN & set(found["flags"].split(","))
            and str(found.get("slave-priority", found.get("replica-priority", "1"))) != "0"
        }

    def stop(self, timeout: float = 10.0) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=timeout)
        self.client.close()

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""
