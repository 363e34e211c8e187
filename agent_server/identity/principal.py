"""Who is calling: the principal a request was authenticated as, and the refusal.

Authentication (`authenticators.py`) turns a request into a `Principal` or
raises `Unauthorized`; ownership and authorization stand on the principal's identity, tenant
and scopes (docs/security.md). Plain data, so the model, the stores and the reasoner's
context can carry it without the HTTP layer.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from types import MappingProxyType
from typing import Any

#: The scopes that reach every tenant's work (docs/security.md).
ADMIN_SCOPES = frozenset({"admin", "agent-server:admin"})
#: The scopes that read `/metrics`, the counts of every tenant's work, and nothing more
#: (a scraper's token); an admin reads them too.
METRICS_SCOPES = frozenset({"metrics", "agent-server:metrics"})
#: Longest identity or tenant taken: they go into records, logs and traces.
MAX_NAME_LENGTH = 256

_EMPTY: Mapping[str, Any] = MappingProxyType({})


class Unauthorized(Exception):
    """The request's credentials do not name a principal: 401.

    Raised by an authenticator, the built-in ones or the user's `@agent.authenticate`. The
    message is for the server's own debugging and is never sent: every refusal answers the
    same bytes, so a caller learns nothing about why."""


def check_name(value: object, what: str) -> str:
    """An identity or tenant: a non-empty printable string of at most MAX_NAME_LENGTH
    characters, so a log line or a record key cannot be bent by it."""
    if not isinstance(value, str) or not value:
        raise ValueError(f"{what} must be a non-empty string")
    if len(value) > MAX_NAME_LENGTH:
        raise ValueError(f"{what} must be at most {MAX_NAME_LENGTH} characters")
    if not value.isprintable():
        raise ValueError(f"{what} must hold no control characters")
    return value


#: The mark of an identity's own tenant (a caller whose credentials name none): its tenant
#: is its identity after this character, which no named tenant may begin with, so a caller
#: without a tenant never shares one named like its identity (a user `acme`, a tenant `acme`).
OWN_TENANT_MARK = "~"


def check_tenant(value: object, what: str) -> str:
    """A named tenant: a name (`check_name`) that does not begin with OWN_TENANT_MARK."""
    tenant = check_name(value, what)
    if tenant.startswith(OWN_TENANT_MARK):
        raise ValueError(
            f"{what} must not begin with {OWN_TENANT_MARK!r}, which marks an identity's own tenant"
        )
    return tenant


def own_tenant(identity: str) -> str:
    """The tenant of a caller whose credentials name none: its identity's own."""
    return OWN_TENANT_MARK + identity


@dataclass(frozen=True, slots=True, init=False)
class Principal:
    """The caller: `identity` (who), `tenant` (whose work it reaches; `~identity`, its own,
    when the credentials name none), `scopes` and the token's `claims` (empty for a static
    token).

    The claims stay out of the repr, so logging a principal shows no claim value."""

    identity: str
    tenant: str
    scopes: frozenset[str]
    claims: Mapping[str, Any] = field(repr=False, compare=False, hash=False)

    def __init__(
        self,
        identity: str,
        tenant: str | None = None,
        scopes: Iterable[str] = (),
        claims: Mapping[str, Any] | None = None,
    ) -> None:
        check_name(identity, "identity")
        if tenant is not None and tenant != own_tenant(identity):  # its own: read back
            check_tenant(tenant, "tenant")
        if isinstance(scopes, str):
            raise TypeError("scopes must be a collection of strings, not one string")
        taken = frozenset(scopes)
        if not all(isinstance(scope, str) for scope in taken):
            raise TypeError("scopes must be strings")
        object.__setattr__(self, "identity", identity)
        # A caller naming no tenant is its own tenant, apart from every named one.
        object.__setattr__(self, "tenant", own_tenant(identity) if tenant is None else tenant)
        object.__setattr__(self, "scopes", taken)
        object.__setattr__(self, "claims", _EMPTY if not claims else MappingProxyType(dict(claims)))

    @property
    def reads_metrics(self) -> bool:
        """Whether it may read `/metrics`: they count every tenant's work, so an admin's
        scope or a scraper's (`metrics`, `agent-server:metrics`)."""
        return self.is_admin or not self.scopes.isdisjoint(METRICS_SCOPES)

    @property
    def is_admin(self) -> bool:
        """Whether it reaches every tenant's work: scope `admin` or `agent-server:admin`."""
        return not self.scopes.isdisjoint(ADMIN_SCOPES)
