"""Settings: every flag of `agent-server run`, with its AGENT_SERVER_* environment twin.

The shutdown budget is checked here, at start, so a grace period that cannot hold the
configured phases is a clear error before any work is accepted, not a surprise at SIGTERM.
"""

from __future__ import annotations

from typing import Literal

from pydantic import Field, PrivateAttr, SecretStr, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from agent_server.auth import check_token, read_token_file

#: Seconds kept between the end of the planned shutdown and the platform's SIGKILL.
SHUTDOWN_MARGIN = 1.0


class Settings(BaseSettings):
    """Validated configuration; flags win over the environment, which wins over defaults."""

    model_config = SettingsConfigDict(env_prefix="AGENT_SERVER_", extra="forbid", frozen=True)

    host: str = "127.0.0.1"
    port: int = Field(default=8000, ge=0, le=65535)
    grace_period: float = Field(default=30.0, gt=0)
    unready_delay: float = Field(default=0.0, ge=0)
    drain_timeout: float | None = Field(default=None, ge=0)
    cancel_timeout: float = Field(default=5.0, ge=0)
    http_timeout: float = Field(default=1.0, ge=0)
    max_inflight: int = Field(default=1000, ge=1)
    max_body_size: int = Field(default=1_048_576, ge=1)
    body_timeout: float = Field(default=30.0, gt=0)
    write_timeout: float = Field(default=30.0, gt=0)
    result_ttl: float = Field(default=3600.0, gt=0)
    max_retained: int = Field(default=10_000, ge=0)
    log_level: Literal["critical", "error", "warning", "info", "debug"] = "info"
    log_format: Literal["text", "json"] = "text"
    pushgateway: str | None = None
    api_token: SecretStr | None = None
    api_token_file: str | None = None
    _file_token: SecretStr | None = PrivateAttr(default=None)

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
