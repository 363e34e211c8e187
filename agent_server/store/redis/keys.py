"""The names of one agent's keys and channels, in one place (docs/replicas.md#key-layout)."""

from __future__ import annotations


class Keys:
    """Every key and channel of one agent's store is named here."""

    __slots__ = ("ends", "events", "prefix", "queued", "renewals", "replicas")

    def __init__(self, agent_name: str) -> None:
        self.prefix = f"agent-server:{agent_name}:"
        self.replicas = self.prefix + "replicas"
        self.renewals = self.prefix + "renewals"
        #: Channels: ends written, ids with new events, ids just queued.
        self.ends = self.prefix + "ends"
        self.events = self.prefix + "events"
        self.queued = self.prefix + "queued"

    def stream(self, execution_id: str) -> str:
        """An execution's events."""
        return f"{self.prefix}ev:{execution_id}"

    def releasing(self, session_id: str) -> str:
        return f"{self.prefix}releasing:{session_id}"

    def released(self, release_id: str) -> str:
        return f"{self.prefix}released:{release_id}"

    def cancel(self, replica: str) -> str:
        """The channel of cancel requests for one replica."""
        return f"{self.prefix}cancel:{replica}"
