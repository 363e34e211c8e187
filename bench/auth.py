"""What knowing the caller costs: authentication and a tenant's filtered list, against
`--api-token`, in the same run.

One real `agent-server run bench.bench_app:agent` with all three credentials at once: the
shared `--api-token` (the baseline: one digest compared), a tokens file of `--tokens` lines
(a lookup by digest, the file's `stat` at most once a second) and a JWT signed RS256 and
verified with a cached public key (`--jwt-public-key-file`). The routes: `GET
/executions/{id}` (a read, the cheapest route that reaches the store) with each credential,
and `GET /executions?limit=50` as a tenant (its own index: `--tenants` tenants share the
records) and as the admin token (every tenant's, the list before tenants). Each figure is
requests per second over `--duration` seconds on `--concurrency` keep-alive connections,
repeated `--repeat` times in turn, with its ratio to the `--api-token` read of the same
round.

Usage: python -m bench.auth [--duration 3] [--repeat 3] [--concurrency 8] [--records 5000]
                            [--tenants 10] [--tokens 1000] [--store redis://...]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from joserfc import jwt
from joserfc.jwk import RSAKey

from bench.common import (
    ServerProcess,
    Spread,
    agent_server_argv,
    drive,
    drive_for,
    free_port,
    http_request,
    log,
    machine_load,
    write_json,
)

API_TOKEN = "bench-api-token-0123456789abcdef0123456789abcdef"
AUDIENCE = "https://agents.example.com"
ISSUER = "https://idp.example.com/"
ECHO_BODY = b'{"text": "hello"}'
#: The scenarios, in the order each round runs them: (name, path kind, credential).
SCENARIOS = (
    ("read, --api-token", "read", "api"),
    ("read, tokens file", "read", "file"),
    ("read, JWT (cached key)", "read", "jwt"),
    ("list of 50, a tenant's", "list", "file"),
    ("list of 50, admin (all tenants)", "list", "api"),
)


def _tokens_file(directory: Path, lines: int, tenants: int) -> tuple[Path, str]:
    """A tokens file of `lines` machines over `tenants` tenants; the token of tenant t0."""
    path = directory / "tokens"
    text = [f"bench-machine-{i:06d}-aaaaaaaaaaaaaaaa m{i} t{i % tenants}" for i in range(lines)]
    path.write_text("\n".join(text) + "\n")
    return path, "bench-machine-000000-aaaaaaaaaaaaaaaa"


def _jwt(directory: Path) -> tuple[Path, str]:
    """A public key file, and a token it verifies (tenant t0, valid for an hour)."""
    key = RSAKey.generate_key(2048, parameters={"kid": "bench"})
    path = directory / "key.pem"
    path.write_bytes(key.as_pem(private=False))
    now = int(time.time())
    claims = {"sub": "ann", "org_id": "t0", "aud": AUDIENCE, "iss": ISSUER}
    claims |= {"iat": now, "nbf": now, "exp": now + 3600}
    token = jwt.encode({"alg": "RS256", "kid": "bench"}, claims, key, algorithms=["RS256"])
    return path, token


async def _fill(port: int, records: int, tokens: list[str]) -> str:
    """`records` executions started in turn by each tenant's token; the id of one of t0's."""
    kept: list[str] = []

    def keep(status: int, body: bytes) -> None:
        if status == 202 and not kept:
            kept.append(json.loads(body)["execution_id"])

    def start(index: int) -> bytes:
        token = tokens[index % len(tokens)]
        headers = {"Authorization": f"Bearer {token}"}
        return http_request("POST", "/reasoners/echo/async", ECHO_BODY, headers)

    result = await drive(port, start, count=records, concurrency=8, timeout=300, keep=keep)
    if result.errors or not kept:
        raise RuntimeError(f"filling the store failed: {result.statuses}")
    return kept[0]


def run(
    *,
    duration: float = 3.0,
    repeat: int = 3,
    concurrency: int = 8,
    records: int = 5000,
    tenants: int = 10,
    tokens: int = 1000,
    store: str | None = None,
    progress: Callable[[str], None] = log,
) -> dict[str, Any]:
    with tempfile.TemporaryDirectory() as scratch:
        directory = Path(scratch)
        tokens_path, file_token = _tokens_file(directory, tokens, tenants)
        key_path, jwt_token = _jwt(directory)
        flags = [
            *("--api-token", API_TOKEN, "--api-tokens-file", str(tokens_path)),
            *("--jwt-public-key-file", str(key_path), "--jwt-audience", AUDIENCE),
            *("--jwt-issuer", ISSUER, "--jwt-tenant-claim", "org_id"),
            *("--max-retained", str(records * 2), "--log-level", "warning"),
        ]
        if store is not None:
            flags += ["--store", store]
        port = free_port()
        credentials = {"api": API_TOKEN, "file": file_token, "jwt": jwt_token}
        with ServerProcess(
            "auth", agent_server_argv(port, "bench.bench_app:agent", *flags), port
        ) as server:
            server.wait_ready()
            fillers = [f"bench-machine-{t:06d}-aaaaaaaaaaaaaaaa" for t in range(tenants)]
            execution_id = asyncio.run(_fill(port, records, fillers))
            figures: dict[str, list[float]] = {name: [] for name, _, _ in SCENARIOS}
            ratios: dict[str, list[float]] = {name: [] for name, _, _ in SCENARIOS}
            for round_index in range(repeat):
                rates: dict[str, float] = {}
                for name, kind, credential in SCENARIOS:
                    path = (
                        f"/executions/{execution_id}" if kind == "read" else "/executions?limit=50"
                    )
                    raw = http_request(
                        "GET", path, headers={"Authorization": f"Bearer {credentials[credential]}"}
                    )
                    result = asyncio.run(
                        drive_for(
                            port, lambda _i, r=raw: r, duration=duration, concurrency=concurrency
                        )
                    )
                    if result.errors:
                        raise RuntimeError(f"{name}: {result.statuses}")
                    rates[name] = result.rps
                    progress(f"round {round_index + 1} {name}: {result.rps:.0f} req/s")
                for name in rates:
                    figures[name].append(rates[name])
                    ratios[name].append(rates[name] / rates[SCENARIOS[0][0]])
    return {
        "store": "redis" if store else "memory",
        "duration": duration,
        "repeat": repeat,
        "concurrency": concurrency,
        "records": records,
        "tenants": tenants,
        "tokens": tokens,
        "load": machine_load(),
        "scenarios": {
            name: {
                "rps": Spread.of(figures[name]).as_dict(),
                "ratio": Spread.of(ratios[name]).as_dict(),
            }
            for name in figures
        },
    }


def markdown(data: dict[str, Any]) -> str:
    lines = [
        f"{data['store']} store, {data['records']} records over {data['tenants']} tenants, "
        f"{data['tokens']} tokens in the file, {data['concurrency']} connections, "
        f"{data['repeat']} rounds of {data['duration']} s (load {data['load']})",
        "",
        "| scenario | req/s (median) | ratio to the `--api-token` read |",
        "|---|---|---|",
    ]
    for name, entry in data["scenarios"].items():
        lines.append(f"| {name} | {entry['rps']['median']:.0f} | {entry['ratio']['median']:.2f} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--duration", type=float, default=3.0)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--records", type=int, default=5000)
    parser.add_argument("--tenants", type=int, default=10)
    parser.add_argument("--tokens", type=int, default=1000)
    parser.add_argument("--store", default=None)
    args = parser.parse_args()
    data = run(
        duration=args.duration,
        repeat=args.repeat,
        concurrency=args.concurrency,
        records=args.records,
        tenants=args.tenants,
        tokens=args.tokens,
        store=args.store,
    )
    write_json("auth", data)
    print(markdown(data))


if __name__ == "__main__":
    main()
