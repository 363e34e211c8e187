"""A seeded fault-injection harness in the spirit of Jepsen (docs/replicas.md).

Its modules: `cluster` (the replicas and haproxy), `redis_parts` (the Redis under test and
its proxies), `postgres_parts` (the Postgres under test: a primary and its synchronous
standby, behind the same proxies), `load` (the client threads), `history` (what they saw),
`nemesis` (the faults), `evidence` and `checker` (the invariants) and `run` (one run, end to
end).

The parts are real and on loopback: Redis with AOF (by default a primary and two replicas under
three real `redis-sentinel`, else one `redis-server`: `redis_parts`), small TCP
proxies between the replicas and Redis (so the link can be cut), three `agent-server run
tests_app:agent` replicas on one store behind haproxy. Client threads run a load through
haproxy with the project's `AgentClient` and with raw httpx (runs, starts, cancels, parked
asks of one and of two questions, delayed starts, starts under a concurrency limit, messages
enqueued in a session), and every HTTP exchange goes to a `History`. A nemesis, on a schedule
drawn from `random.Random(seed)`, kills, rolls and pauses replicas, pauses and restarts the
Redis primary, fails it over (`SENTINEL FAILOVER`, and SIGKILL of the primary), and cuts the
proxies, logging each action in the history.
Then everything is healed, the load stops, the system quiesces (bounded), every execution
ever named is read back through a live replica, and `check` (a pure function of the history,
the final records, the reasoners' own evidence files and the replicas' logs) returns the
violations of the invariants.

With `store="postgres"` (`python -m bench.faults --store postgres`) the replicas run on a
Postgres primary and its synchronous streaming standby instead, every connection through a
proxy; the nemesis keeps the replica-level faults and deals Postgres's own (kill -9 and
restart of the primary, a pause of it, cuts, a failover to the standby with the old primary
fenced and re-seeded). The load, the history and the checker are the same.

`run_faults(seed, seconds, directory)` is one run (`run`); tests/process/test_faults.py runs
a short one in CI, `python -m bench.faults` long ones.
"""

from tests.support.faults.checker import INVARIANTS, check, log_errors
from tests.support.faults.cluster import FAULT_KINDS, FaultCluster, FaultReplica, fault_kinds
from tests.support.faults.evidence import Evidence, Final, Violation
from tests.support.faults.history import Call, Exchange, History, NemesisEvent, Note
from tests.support.faults.load import LoadClient
from tests.support.faults.nemesis import Fault, Nemesis, schedule
from tests.support.faults.postgres_parts import PostgresPair
from tests.support.faults.redis_parts import AofRedis, CutProxy, stable_port
from tests.support.faults.run import FaultRun, run_faults

__all__ = [
    "FAULT_KINDS",
    "INVARIANTS",
    "AofRedis",
    "Call",
    "CutProxy",
    "Evidence",
    "Exchange",
    "Fault",
    "FaultCluster",
    "FaultReplica",
    "FaultRun",
    "Final",
    "History",
    "LoadClient",
    "Nemesis",
    "NemesisEvent",
    "Note",
    "PostgresPair",
    "Violation",
    "check",
    "fault_kinds",
    "log_errors",
    "run_faults",
    "schedule",
    "stable_port",
]
