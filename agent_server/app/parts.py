"""What one configured agent runs with: the store, the registry, session releases, the
queue taker, webhooks and the shutdown sequence, wired from the `Settings`. The schedule
ticker is added by the agent once the use cases are built (`Agent._ticker`): it starts
through them."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

from agent_server.model.reasoner import Reasoner
from agent_server.model.versions import Rule, advert
from agent_server.model.waiting import Closing
from agent_server.runtime.durable import QueueTaker
from agent_server.runtime.metrics import Metrics
from agent_server.runtime.otel import tracing_from
from agent_server.runtime.registry import InFlightRegistry
from agent_server.runtime.replica_state import replica_state
from agent_server.runtime.sessions import SessionReleases
from agent_server.runtime.settings import Settings
from agent_server.runtime.shutdown import Phase, ShutdownPlan, ShutdownSequence
from agent_server.runtime.tracing import Tracing, webhook_headers
from agent_server.runtime.webhooks import WebhookSender
from agent_server.service.schedule_ticker import ScheduleTicker
from agent_server.store import ExecutionStore, open_store


class Parts:
    """What one configured agent runs with, each part given only what it uses."""

    def __init__(
        self,
        store: ExecutionStore,
        registry: InFlightRegistry,
        releases: SessionReleases,
        shutdown: ShutdownSequence,
        taker: QueueTaker,
        streams_closing: Closing,
        webhooks: WebhookSender | None,
        tracing: Tracing,
    ) -> None:
        self.store, self.tracing, self.registry, self.releases = store, tracing, registry, releases
        self.shutdown, self.taker = shutdown, taker
        #: Set when the listener closes: open event streams end with a retry hint.
        self.streams_closing = streams_closing
        #: Delivers webhooks, when a secret is set.
        self.webhooks = webhooks
        #: The schedules it fires, built with the use cases (app/agent.py `Agent._ticker`).
        self.schedules: ScheduleTicker | None = None

    def describe(self) -> dict[str, Any]:
        """This replica, for `GET /replicas` (the others read it from a shared store)."""
        return replica_state(self.store.replica_id, self.store.advert, self.registry, self.shutdown)

    @classmethod
    def build(
        cls,
        name: str,
        reasoners: dict[str, Reasoner],
        settings: Settings,
        metrics: Metrics,
        set_phase: Callable[[Phase], None],
    ) -> Parts:
        store = open_store(
            settings.store_url,
            replica_id=settings.replica_id,
            agent_name=name,
            result_ttl=settings.result_ttl,
            max_retained=settings.max_retained,
            max_retained_bytes=settings.max_retained_bytes,
            lease_ttl=settings.lease_ttl,
            max_events=settings.max_events,
            observer=metrics,
            max_answer_bytes=settings.max_answer_bytes,
            max_inflight=settings.max_inflight,
            pool_size=settings.store_pool_size,
            notify=settings.store_notify,
        )
        streams_closing = Closing()
        tracing = tracing_from(os.environ, name, settings.replica_id)  # the OTEL_* variables
        registry = InFlightRegistry(
            store,
            max_inflight=settings.max_inflight,
            max_checkpoint_size=settings.max_checkpoint_size,
            max_events=settings.max_events,
            observer=metrics,
            queue_when_full=settings.queue_when_full,
            max_queued=settings.max_queued,
            tracing=tracing,
            cancel_timeout=settings.cancel_timeout,
        )
        store.deliver_cancels(registry.cancel)
        store.deliver_answers(registry.answer)
        store.deliver_orphans(registry.runs, registry.adopt)
        store.deliver_vanished(registry.owned_ids, registry.vanish)
        # What this replica's claims read (claim.lua), and how many waited for a version.
        store.advertise(advert({name: r.versions for name, r in reasoners.items()}))
        store.on_version_waits = lambda count: metrics.version_rule(Rule.WAIT, count)
        releases = SessionReleases(store, registry, observer=metrics)
        secret = settings.signing_secret
        webhooks = (
            None
            if secret is None
            else WebhookSender(
                store,
                secret=secret,
                allow=settings.webhook_targets,
                retry_for=settings.webhook_retry_for,
                observer=metrics,
                extra_headers=webhook_headers,
            )
        )
        shutdown = ShutdownSequence(
            registry,
            metrics,
            set_phase,
            ShutdownPlan.from_settings(settings),
            limit_releases=releases.limit,
            flush_ends=store.flush,
            end_streams=streams_closing.set,
            flush_webhooks=None if webhooks is None else webhooks.flush,
            cancel_queued=registry.cancel_queued,
            flush_spans=tracing.flush,
            writes_owed=store.writes_owed,
        )
        taker = QueueTaker(store, registry, reasoners, metrics.version_rule)
        parts = cls(store, registry, releases, shutdown, taker, streams_closing, webhooks, tracing)
        store.describe(parts.describe)
        return parts
