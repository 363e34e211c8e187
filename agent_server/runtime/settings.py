"""Settings: every flag of `agent-server run`, with its AGENT_SERVER_* environment twin.

The CLI makes one flag per field (name, type, choices, default and help from the field and
its `description`), so a setting is declared here once.

The shutdown budget is checked here, at start, so a grace period that cannot hold the
configured phases is a clear error before any work is accepted, not a surprise at SIGTERM.
"""

from __future__ import annotations

import secrets
import socket
import ssl
from typing import Annotated, Literal
from urllib.parse import urlsplit

from pydantic import Field, PrivateAttr, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from agent_server.identity.jwt_keys import (
    KeyFileError,
    VerifyingKey,
    load_public_key_file,
    load_secret_file,
)
from agent_server.identity.tokens import check_token, read_token_file
from agent_server.identity.tokens_file import read_tokens_file
from agent_server.model.asks import MAX_ANSWER_BYTES
from agent_server.model.execution import MAX_SECONDS
from agent_server.runtime.setting_checks import check_origins
from agent_server.runtime.webhooks import AllowList, check_secret, check_url, read_secret_file
from agent_server.store.urls import check_store_url

#: Seconds kept between the end of the planned shutdown and the platform's SIGKILL.
SHUTDOWN_MARGIN = 1.0
#: The largest count or size any setting takes.
MAX_COUNT = 2**31 - 1

#: A duration setting: finite (no inf, no nan) and at most MAX_SECONDS.
Seconds = Annotated[float, Field(allow_inf_nan=False, le=MAX_SECONDS)]
#: A count or size setting: at most MAX_COUNT.
Count = Annotated[int, Field(le=MAX_COUNT)]


class Settings(BaseSettings):
    """Validated configuration; flags win over the environment, which wins over defaults."""

    model_config = SettingsConfigDict(env_prefix="AGENT_SERVER_", extra="forbid", frozen=True)

    host: str = Field(default="127.0.0.1", description="Address to listen on.")
    port: int = Field(default=8000, ge=0, le=65535, description="Port to listen on.")
    grace_period: Seconds = Field(
        default=30.0,
        gt=0,
        description="Seconds the platform allows from SIGTERM to SIGKILL "
        "(Kubernetes terminationGracePeriodSeconds).",
    )
    unready_delay: Seconds = Field(
        default=0.0,
        ge=0,
        description="Seconds readiness is 503 while new work is still accepted.",
    )
    drain_timeout: Seconds | None = Field(
        default=None,
        ge=0,
        description="Seconds running work may take to finish before it is cancelled; "
        "by default what the grace period leaves.",
    )
    cancel_timeout: Seconds = Field(
        default=5.0,
        ge=0,
        description="Seconds cancelled work may take to settle.",
    )
    http_timeout: Seconds = Field(
        default=1.0,
        ge=0,
        description="Seconds open responses get after the listener closes.",
    )
    max_inflight: Count = Field(
        default=1000, ge=1, description="Running executions at once; beyond it, 429."
    )
    queue_when_full: bool = Field(
        default=False,
        description="An async start beyond --max-inflight is queued (202 queued) for the "
        "first replica with room, instead of 429.",
    )
    max_queued: Count = Field(
        default=10_000,
        ge=0,
        description="Queued executions at most (delayed, retrying, waiting for room), across "
        "the replicas sharing the store; a start beyond it is 429.",
    )
    max_body_size: Count = Field(
        default=1_048_576, ge=1, description="Request body bytes; beyond it, 413."
    )
    body_timeout: Seconds = Field(
        default=30.0,
        gt=0,
        description="Seconds a request body may take to arrive after its head; then 408.",
    )
    write_timeout: Seconds = Field(
        default=30.0,
        gt=0,
        description="Seconds a client may leave its answer unread before the connection is cut.",
    )
    result_ttl: Seconds = Field(
        default=3600.0,
        gt=0,
        description="Seconds finished executions are kept.",
    )
    max_retained: Count = Field(
        default=10_000, ge=0, description="Finished executions kept at most."
    )
    max_retained_bytes: int = Field(
        default=256 * 1024 * 1024,
        ge=0,
        le=2**50,
        description="Bytes of inputs, results and errors (as JSON) finished executions keep at "
        "most, across the agent; the oldest go first.",
    )
    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field(
        default="info", description="Lowest level logged."
    )
    log_format: Literal["text", "json"] = Field(
        default="text", description="text, or json: one JSON object per line."
    )
    access_log: bool = Field(default=False, description="Log one line per HTTP request.")
    store: SecretStr = Field(
        default=SecretStr("memory"),
        description="Where execution records live: memory, or a redis:// / rediss:// URL "
        "shared by every replica (redis+sentinel://host:26379,host2:26379/SERVICE/DB through "
        "Sentinel), or a postgresql:// (postgres://) URL (docs/postgres.md).",
    )
    store_pool_size: int = Field(
        default=10,
        ge=2,
        le=1000,
        description="Postgres: connections a replica holds at most (docs/postgres.md: "
        "replicas x this must stay under max_connections).",
    )
    store_notify: Literal["listen", "poll"] = Field(
        default="listen",
        description="Postgres: listen (LISTEN/NOTIFY, a poll of at most 1 s behind it), or "
        "poll alone (behind a pooler in transaction mode).",
    )
    replica_id: str = Field(
        default_factory=lambda: f"{socket.gethostname()}-{secrets.token_hex(3)}",
        min_length=1,
        max_length=253,
        pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$",
        description="This process's name in the store; by default the hostname and a random "
        "suffix (on Kubernetes, give the pod name).",
    )
    lease_ttl: Seconds = Field(
        default=10.0,
        gt=0,
        description="Seconds this replica's liveness lasts unrenewed; renewed every third of it.",
    )
    idempotency_ttl: Seconds = Field(
        default=86_400.0,
        gt=0,
        description="Seconds an Idempotency-Key is remembered: a repeat gets the same execution.",
    )
    max_answer_bytes: int = Field(
        default=MAX_ANSWER_BYTES,
        ge=1,
        le=2**40,
        description="Bytes of answers to its requests for input (as JSON) an execution keeps "
        "until it ends; past it the oldest go first, and one answer larger is refused (413).",
    )
    max_checkpoint_size: Count = Field(
        default=65_536,
        ge=1,
        description="Bytes of JSON a resumable reasoner's checkpoint may take.",
    )
    max_schedules: Count = Field(
        default=1000,
        ge=0,
        description="Schedules a tenant may make through the API (declared ones aside); "
        "one more is 409.",
    )
    max_schedule_input_size: Count = Field(
        default=65_536,
        ge=2,
        description="Bytes of JSON a schedule's input may take (every replica keeps every "
        "schedule in memory); beyond it, 413.",
    )
    max_events: Count = Field(
        default=1000,
        ge=1,
        description="Events kept per execution for replay (the oldest go first).",
    )
    sse_heartbeat: Seconds = Field(
        default=15.0,
        gt=0,
        description="Seconds between heartbeat comments on a quiet event stream.",
    )
    pushgateway: str | None = Field(
        default=None,
        description="Prometheus Pushgateway URL the shutdown metrics are pushed to at exit.",
    )
    api_token: SecretStr | None = Field(
        default=None,
        description="Bearer token every route but the health probes requires (/metrics "
        "too, unless --metrics-open).",
    )
    api_token_file: str | None = Field(
        default=None, description="File holding the bearer token (a mounted secret)."
    )
    metrics_open: bool = Field(
        default=False,
        description="With authentication on, serve /metrics without a token too (a scraper "
        "that cannot send one).",
    )
    # -- authentication (docs/security.md) -------------------------------------------------
    api_tokens_file: str | None = Field(
        default=None,
        description="File of bearer tokens, a line each: token identity [tenant] "
        "[scope,...]; re-read when it changes (a mounted secret rotates without a restart).",
    )
    jwt_jwks_url: str | None = Field(
        default=None,
        max_length=4096,
        description="URL of the identity provider's JWKS: JWT bearer tokens are verified "
        "with its keys (cached; fetched again at once for an unknown kid, at most every 10 s).",
    )
    jwt_public_key_file: str | None = Field(
        default=None,
        description="File holding the public key JWT bearer tokens are verified with (PEM, "
        "a JWK or a JWKS).",
    )
    jwt_secret_file: str | None = Field(
        default=None,
        description="File holding the HS256/384/512 secret JWT bearer tokens are verified "
        "with (at least 32 bytes).",
    )
    jwt_audience: str | None = Field(
        default=None,
        min_length=1,
        max_length=1024,
        description="The audience (aud) a JWT must name; required with a JWT key.",
    )
    jwt_issuer: str | None = Field(
        default=None,
        min_length=1,
        max_length=1024,
        description="The issuer (iss) a JWT must name; any when not given.",
    )
    jwt_tenant_claim: str | None = Field(
        default=None,
        min_length=1,
        max_length=256,
        description="The JWT claim naming the caller's tenant (org_id, tid); without it, or "
        "when a token lacks it, the caller is its own tenant.",
    )
    docs: bool = Field(True, description="Serve Swagger UI at /docs (its assets in the package).")
    console: bool = Field(True, description="Serve the console at /console (docs/console.md).")
    a2a: bool = Field(
        default=False,
        description="Serve A2A (the Agent2Agent protocol): the agent card at "
        "/.well-known/agent-card.json and JSON-RPC at /a2a; needs the a2a extra.",
    )
    public_url: str | None = Field(
        default=None,
        max_length=2048,
        description="The URL clients reach the server at (https://agents.example.com/agent), "
        "for the A2A card; by default the URL each request reached (its host and root path).",
    )
    mcp: bool = Field(
        default=False,
        description="Serve MCP (Streamable HTTP) at /mcp: each reasoner a tool, calls and "
        "tasks as executions (needs the mcp extra; docs/protocols.md).",
    )
    # -- uvicorn's own flags, with uvicorn's meaning and default (docs/settings.md) ---------
    reload: bool = Field(
        default=False,
        description="Restart the server when Python files under the current directory "
        "change (development only: docs/settings.md says what differs).",
    )
    root_path: str = Field(
        default="",
        max_length=1024,
        description="The ASGI root_path: the prefix a proxy strips before the request "
        "reaches the server (/agent); Location headers and links carry it.",
    )
    proxy_headers: bool = Field(
        default=True,
        description="Take the client's address and scheme from X-Forwarded-For and "
        "X-Forwarded-Proto, when the peer is one of --forwarded-allow-ips.",
    )
    forwarded_allow_ips: str | None = Field(
        default=None,
        max_length=4096,
        description="Comma-separated addresses or networks whose proxy headers are "
        "trusted ('*': any); by default $FORWARDED_ALLOW_IPS, else 127.0.0.1 (uvicorn's).",
    )
    ssl_certfile: str | None = Field(
        default=None, description="TLS certificate file (PEM): serve HTTPS."
    )
    ssl_keyfile: str | None = Field(
        default=None,
        description="TLS private key file (PEM), when the certificate file does not hold it.",
    )
    ssl_keyfile_password: SecretStr | None = Field(
        default=None, description="Password of an encrypted TLS key file."
    )
    app_dir: str = Field(
        default="",
        description="Directory put first on the module search path to import APP; by "
        "default the current directory.",
    )
    cors_allow_origin: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description="An origin (https://app.example.com, or *) whose browser pages may call "
        "the API and read its event streams; repeat the flag for more (the environment "
        "twin takes a comma-separated list).",
    )
    # -- webhooks (docs/webhooks.md) -------------------------------------------------------
    webhook_url: str | None = Field(
        default=None,
        description="URL every execution's webhooks are POSTed to (execution.finished, "
        "execution.input_required) unless its start gives X-Webhook-URL; needs a secret.",
    )
    webhook_secret: SecretStr | None = Field(
        default=None,
        description="Standard Webhooks signing secret (whsec_ and base64 of 24 to 64 bytes); "
        "webhooks are off without one.",
    )
    webhook_secret_file: str | None = Field(
        default=None, description="File holding the webhook secret (a mounted secret)."
    )
    webhook_retry_for: Seconds = Field(
        default=86_400.0,
        gt=0,
        description="Seconds a webhook delivery is retried (exponential backoff, full "
        "jitter; the first retry within min(1 s, a hundredth of this)) before it is given up.",
    )
    webhook_allow: Annotated[tuple[str, ...], NoDecode] = Field(
        default=(),
        description="A host name or CIDR that webhooks may reach although it is loopback, "
        "private or link-local (refused otherwise); repeat the flag for more (the "
        "environment twin takes a comma-separated list).",
    )
    _file_token: SecretStr | None = PrivateAttr(default=None)
    _jwt_keys: tuple[VerifyingKey, ...] = PrivateAttr(default=())
    _file_webhook_secret: SecretStr | None = PrivateAttr(default=None)

    @field_validator("webhook_url")
    @classmethod
    def _check_webhook_url(cls, value: str | None) -> str | None:
        return None if value is None else check_url(value, "webhook-url")

    @field_validator("webhook_allow", "cors_allow_origin", mode="before")
    @classmethod
    def _split_list(cls, value: object) -> object:
        """A list's environment twin is one string: `hooks.internal,10.0.0.0/8`."""
        if isinstance(value, str):
            return tuple(part.strip() for part in value.split(",") if part.strip())
        return value

    @field_validator("webhook_allow")
    @classmethod
    def _check_allow(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        AllowList.parse(value)
        return value

    @model_validator(mode="after")
    def _check_webhooks(self) -> Settings:
        """One secret source, read and checked here (a bad one fails the start); a URL for
        every execution needs it."""
        if self.webhook_secret is not None and self.webhook_secret_file is not None:
            raise ValueError("give webhook-secret or webhook-secret-file, not both")
        if self.webhook_secret is not None:
            check_secret(self.webhook_secret.get_secret_value())
        if self.webhook_secret_file is not None:
            self._file_webhook_secret = SecretStr(read_secret_file(self.webhook_secret_file))
        if self.webhook_url is not None and self.signing_secret is None:
            raise ValueError("webhook-url needs webhook-secret or webhook-secret-file")
        return self

    @property
    def signing_secret(self) -> str | None:
        """The webhook secret, or None when webhooks are off."""
        secret = (
            self.webhook_secret if self.webhook_secret is not None else self._file_webhook_secret
        )
        return None if secret is None else secret.get_secret_value()

    @property
    def webhook_targets(self) -> AllowList:
        return AllowList.parse(self.webhook_allow)

    @model_validator(mode="after")
    def _check_api_token(self) -> Settings:
        """One token source; the file is read once, here, so a bad secret fails the start."""
        if self.api_token is not None and self.api_token_file is not None:
            raise ValueError("give api-token or api-token-file, not both")
        if self.api_token is not None:
            check_token(self.api_token.get_secret_value())
        if self.api_token_file is not None:
            self._file_token = SecretStr(read_token_file(self.api_token_file))
        return self

    @field_validator("jwt_jwks_url")
    @classmethod
    def _check_jwks_url(cls, value: str | None) -> str | None:
        """http:// is taken (loopback, tests); https:// is advised. The message never
        quotes the URL, which may carry a credential in its query."""
        if value is None:
            return None
        try:
            parts = urlsplit(value)
            parts.port  # noqa: B018 - raises for a port that is not a number
        except ValueError:
            raise ValueError("jwt-jwks-url is malformed") from None
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise ValueError("jwt-jwks-url must be an http:// or https:// URL with a host")
        return value

    @model_validator(mode="after")
    def _check_authentication(self) -> Settings:
        """The tokens file and the JWT key are read here, so a bad one fails the start; the
        JWT's own settings need a key, and a key needs the audience it is for."""
        if self.api_tokens_file is not None:
            read_tokens_file(self.api_tokens_file)  # refused whole, naming the line
        sources = [
            name
            for name in ("jwt_jwks_url", "jwt_public_key_file", "jwt_secret_file")
            if getattr(self, name) is not None
        ]
        if len(sources) > 1:
            raise ValueError(
                "give one of jwt-jwks-url, jwt-public-key-file and jwt-secret-file, not "
                + " and ".join(name.replace("_", "-") for name in sources)
            )
        if not sources:
            for name in ("jwt_audience", "jwt_issuer", "jwt_tenant_claim"):
                if getattr(self, name) is not None:
                    raise ValueError(
                        f"{name.replace('_', '-')} needs jwt-jwks-url, jwt-public-key-file "
                        "or jwt-secret-file"
                    )
            return self
        if self.jwt_audience is None:
            raise ValueError(
                "jwt-audience is required with a JWT key: a token issued for another "
                "service must not open this one"
            )
        try:
            if self.jwt_public_key_file is not None:
                self._jwt_keys = tuple(load_public_key_file(self.jwt_public_key_file))
            elif self.jwt_secret_file is not None:
                self._jwt_keys = (load_secret_file(self.jwt_secret_file),)
        except KeyFileError as exc:
            raise ValueError(str(exc)) from None
        return self

    @property
    def jwt_keys(self) -> tuple[VerifyingKey, ...]:
        """The keys of --jwt-public-key-file or --jwt-secret-file, read at start."""
        return self._jwt_keys

    @property
    def authenticates(self) -> bool:
        """Whether any authentication flag is given: then every route but the open ones
        needs a bearer token."""
        return (
            self.bearer_token is not None
            or self.api_tokens_file is not None
            or self.jwt_jwks_url is not None
            or bool(self._jwt_keys)
        )

    @field_validator("store")
    @classmethod
    def _check_store(cls, value: SecretStr) -> SecretStr:
        check_store_url(value.get_secret_value())  # one line (exit 2), never the password
        return value

    @field_validator("public_url")
    @classmethod
    def _check_public_url(cls, value: str | None) -> str | None:
        """An absolute http(s) URL without a query or fragment, kept without a final '/'."""
        if value is None:
            return None
        parts = urlsplit(value)
        if parts.scheme not in ("http", "https") or not parts.netloc:
            raise ValueError("public-url must be an absolute http:// or https:// URL")
        if parts.query or parts.fragment or any(c.isspace() or not c.isprintable() for c in value):
            raise ValueError("public-url must have no query, fragment, spaces or controls")
        return value.rstrip("/")

    @field_validator("root_path")
    @classmethod
    def _check_root_path(cls, value: str) -> str:
        """A prefix that joins paths as they are: '/agent' + '/executions/...'."""
        if value and (not value.startswith("/") or value.endswith("/")):
            raise ValueError("root-path must start with '/' and not end with one (/agent)")
        if any(char.isspace() or not char.isprintable() for char in value):
            raise ValueError("root-path must not hold spaces or control characters")
        return value

    @field_validator("cors_allow_origin")
    @classmethod
    def _check_origins(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        return check_origins(value)

    @model_validator(mode="after")
    def _check_tls(self) -> Settings:
        """The certificate and key are loaded once here, so a missing file, a key that does
        not match or a wrong password fails the start (exit 2), not the first handshake."""
        if self.ssl_certfile is None:
            if self.ssl_keyfile is not None or self.ssl_keyfile_password is not None:
                raise ValueError("ssl-keyfile and ssl-keyfile-password need ssl-certfile")
            return self
        given = self.ssl_keyfile_password
        # Never None: for an encrypted key OpenSSL would then ask on the terminal.
        password = "" if given is None else given.get_secret_value()
        try:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(self.ssl_certfile, self.ssl_keyfile, lambda: password)
        except (OSError, ssl.SSLError) as exc:
            # The reason only (the file, the library's words): never the password.
            reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
            files = f"ssl-certfile {self.ssl_certfile!r}"
            if self.ssl_keyfile is not None:
                files += f" with ssl-keyfile {self.ssl_keyfile!r}"
            raise ValueError(f"{files} cannot be loaded: {reason}") from None
        return self

    @property
    def store_url(self) -> str:
        return self.store.get_secret_value()

    @property
    def bearer_token(self) -> str | None:
        """The token requests must carry, or None when authentication is off."""
        token = self.api_token if self.api_token is not None else self._file_token
        return None if token is None else token.get_secret_value()

    @model_validator(mode="after")
    def _check_budget(self) -> Settings:
        fixed = self.unready_delay + self.cancel_timeout + self.http_timeout + SHUTDOWN_MARGIN
        if self.drain_timeout is None:
            if fixed > self.grace_period:
                raise ValueError(
                    f"shutdown budget does not fit: unready-delay {self.unready_delay:g} + "
                    f"cancel-timeout {self.cancel_timeout:g} + http-timeout "
                    f"{self.http_timeout:g} + margin {SHUTDOWN_MARGIN:g} = {fixed:g} s exceeds "
                    f"grace-period {self.grace_period:g} s"
                )
        elif fixed + self.drain_timeout > self.grace_period:
            raise ValueError(
                f"shutdown budget does not fit: unready-delay {self.unready_delay:g} + "
                f"drain-timeout {self.drain_timeout:g} + cancel-timeout "
                f"{self.cancel_timeout:g} + http-timeout {self.http_timeout:g} + margin "
                f"{SHUTDOWN_MARGIN:g} = {fixed + self.drain_timeout:g} s exceeds grace-period "
                f"{self.grace_period:g} s"
            )
        return self

    @property
    def effective_drain_timeout(self) -> float:
        """The drain timeout, derived from what the grace period leaves when not given."""
        if self.drain_timeout is not None:
            return self.drain_timeout
        return max(
            0.0,
            self.grace_period
            - self.unready_delay
            - self.cancel_timeout
            - self.http_timeout
            - SHUTDOWN_MARGIN,
        )
