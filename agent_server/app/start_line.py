"""The line a process logs as it starts: what it serves, where, and its shutdown budget."""

from __future__ import annotations

import logging
from collections.abc import Collection

from agent_server.model.counts import counted
from agent_server.runtime.settings import Settings
from agent_server.runtime.shutdown import ShutdownPlan

logger = logging.getLogger("agent_server.agent")


def log_start(
    name: str, reasoners: Collection[str], settings: Settings, plan: ShutdownPlan, served_here: bool
) -> None:
    """One line naming what this process serves: the agent, its reasoners, its store
    (never a password: the store's own description), this replica."""
    store = settings.store_url
    if store != "memory":
        from agent_server.store.redis import describe_url  # redis-py is loaded already

        store = describe_url(store)
    names = sorted(reasoners)
    # The address configured (`agent-server run`'s; port 0: uvicorn's next line names the
    # port it took; under another ASGI server, its own), and the shutdown budget every
    # deadline is derived from. Logged before the bind, so it says "starting": the ASGI
    # server's next line says where it listens, or why it could not.
    address = f"{settings.host}:{settings.port}" if served_here else None
    budget = {
        "grace_period": plan.grace_period,
        "unready_delay": plan.unready_delay,
        "drain_timeout": plan.drain_timeout,
        "cancel_timeout": plan.cancel_timeout,
        "http_timeout": plan.http_timeout,
    }
    # Another ASGI server closes its listener and waits for its connections (bounded by its
    # own flags only) before the lifespan's shutdown, where the budget starts to count.
    within = "within %gs" if served_here else "within %gs of the ASGI server's lifespan shutdown"
    logger.info(
        "agent %r starting with %s (%s), store %s, as replica %s, to listen on %s; "
        f"shutdown {within} (unready %gs, drain %gs, cancel %gs, http %gs)",
        name,
        counted(len(names), "reasoner"),
        ", ".join(names) or "none",
        store,
        settings.replica_id,
        address or "the ASGI server's address",
        *budget.values(),
        extra={
            "fields": {
                "agent": name,
                "reasoners": names,
                "store": store,
                "replica": settings.replica_id,
                "address": address,
                "shutdown": budget,
            }
        },
    )
