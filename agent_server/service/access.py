"""Who may reach what: the tenant rule, then the user's `@agent.authorize`, for every front.

The tenant rule first: a principal reaches its own tenant's executions only, unless it holds
an admin scope (`admin`, `agent-server:admin`); another tenant's execution is "not found" as
an unknown id, so its existence is not revealed. Then `@agent.authorize`, an async function
of `(principal, action, resource)`, may narrow it: False refuses (`Denied`) on an execution
the principal sees (and refuses a start, a list or a release); for `list` it may return a
filter instead (a mapping, `{"owner": identity}`) that the store applies. It never widens
the tenant rule. A server without authentication has no principal: every rule is off.
docs/security.md#authorization.

`read` is asked wherever a record or a result is handed out, on every front (`reads`): a
call on an execution asks it before it acts, and again on a later record it answers with (a
wait's); a start whose caller may not read it answers only its acceptance, the id.
docs/security.md#what-each-call-asks lists the actions of every call.
"""

from __future__ import annotations

import logging
import traceback
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from agent_server.identity.principal import Principal
from agent_server.model.execution import Execution
from agent_server.service.refusals import Denied
from agent_server.store.base import ExecutionStore

logger = logging.getLogger("agent_server.auth")

#: The actions `@agent.authorize` is asked about (docs/security.md#authorization).
ACTIONS = frozenset({"start", "read", "list", "cancel", "answer", "delete", "release", "schedule"})
#: What a list filter may name: the record's fields the stores filter on.
FILTER_FIELDS = frozenset({"owner"})

#: `@agent.authorize`: the principal, the action and what it acts on, in; True (allow),
#: False (deny) or, for `list`, a filter.
Authorize = Callable[[Principal, str, dict[str, Any]], Awaitable["bool | Mapping[str, Any]"]]

UNKNOWN_EXECUTION = "unknown execution"


class ListScope:
    """Which records a list reads: the tenant's (None: every tenant's, or no tenants at all)
    and the tenant whose names a session filter names; an owner a filter asked for."""

    __slots__ = ("every_tenant", "owner", "tenant")

    def __init__(self, tenant: str | None, every_tenant: bool, owner: str | None = None) -> None:
        self.tenant = tenant
        self.every_tenant = every_tenant
        self.owner = owner


class Access:
    """The tenant rule and the user's `@agent.authorize`, applied by every front."""

    def __init__(self, authorize: Authorize | None = None) -> None:
        self.authorize = authorize

    @staticmethod
    def sees(principal: Principal | None, execution: Execution) -> bool:
        """Whether the principal may know the execution exists: its own tenant's, or an
        admin's, or any on a server without authentication."""
        if principal is None or principal.is_admin:
            return True
        return execution.tenant == principal.tenant

    @staticmethod
    def reach(principal: Principal | None) -> str | None:
        """The one tenant whose records the principal reads, for the store to apply before
        it reads a record (so another tenant's id costs what an unknown one does); None for
        every tenant's (an admin, or a server without authentication)."""
        if principal is None or principal.is_admin:
            return None
        return principal.tenant

    async def find(
        self, store: ExecutionStore, principal: Principal | None, execution_id: str, *actions: str
    ) -> Execution | None:
        """The execution a caller names by id, None when unknown or another tenant's (the
        store tells them apart from neither), once each of `actions` is allowed on it, in
        order (`Denied`): every front's way from an id to a record."""
        execution = await store.get(execution_id, self.reach(principal))
        if execution is None or not self.sees(principal, execution):
            return None
        for action in actions:
            await self.allowed_for(principal, action, execution)
        return execution

    def asks(self, principal: Principal | None) -> bool:
        """Whether `@agent.authorize` has a say for this caller (a function, a principal)."""
        return self.authorize is not None and principal is not None

    async def reads(self, principal: Principal | None, execution: Execution) -> bool:
        """Whether the record may be handed out to the caller: `read` allowed on it, asked
        of the record as it is handed out (no error either way)."""
        if not self.asks(principal):
            return True
        assert principal is not None
        return await self._verdict(principal, "read", execution.to_json()) is True

    async def check_for(
        self, principal: Principal | None, action: str, resource: dict[str, Any]
    ) -> None:
        """`@agent.authorize`'s verdict on the action (`Denied` when it denies); nothing to
        ask without one, or without a principal."""
        verdict = await self._verdict(principal, action, resource)
        if verdict is False:
            raise Denied(action)

    async def allowed_for(
        self, principal: Principal | None, action: str, execution: Execution
    ) -> Execution:
        """The execution, which the caller sees, once the action on it is allowed (`Denied`)."""
        if self.authorize is not None and principal is not None:
            await self.check_for(principal, action, execution.to_json())  # made only then
        return execution

    async def may(self, principal: Principal | None, action: str, execution: Execution) -> bool:
        """Whether the action is allowed on the execution (no refusal either way)."""
        try:
            await self.allowed_for(principal, action, execution)
        except Denied:
            return False
        return True

    async def list_scope_for(
        self, principal: Principal | None, resource: dict[str, Any]
    ) -> ListScope:
        """What a list of the principal reads: its tenant's records (an admin's: everyone's),
        narrowed by a filter `@agent.authorize` returns for `list`."""
        if principal is None:
            return ListScope(None, True)
        verdict = await self._verdict(principal, "list", resource)
        if verdict is False:
            raise Denied("list")
        owner = None
        if isinstance(verdict, Mapping):
            owner_value = verdict.get("owner")
            owner = owner_value if isinstance(owner_value, str) else None
        return ListScope(principal.tenant, principal.is_admin, owner)

    async def _verdict(
        self, principal: Principal | None, action: str, resource: dict[str, Any]
    ) -> bool | Mapping[str, Any]:
        if self.authorize is None or principal is None:
            return True
        try:
            verdict = await self.authorize(principal, action, resource)
        except Exception as exc:  # a bug of the user's function: refused, said without its
            frames = traceback.extract_tb(exc.__traceback__)  # message (it may quote a claim)
            where = f"{frames[-1].filename}:{frames[-1].lineno}" if frames else "?"
            logger.error(
                "@agent.authorize raised %s at %s on %s; refused", type(exc).__name__, where, action
            )
            return False
        if verdict is True:
            return True
        if action == "list" and isinstance(verdict, Mapping) and set(verdict) <= FILTER_FIELDS:
            return verdict
        if verdict is not False:
            logger.error(
                "@agent.authorize returned %s on %s, not True, False%s; refused",
                type(verdict).__name__,
                action,
                " or a filter of owner" if action == "list" else "",
            )
        return False
