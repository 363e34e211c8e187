"""The baseline: bare Starlette routes doing the same work as agent-server's, served by uvicorn
with the settings `agent-server run` uses (lifespan on, no access log, no log config,
`timeout_graceful_shutdown` 1 s, uvicorn's automatic loop and HTTP parser).

- `POST /reasoners/echo`: read the JSON body, answer `{"text": ...}`.
- `POST /reasoners/{echo,park}/async`: start a bare asyncio task, keep it by a random id, 202.
  `park` waits for the drain event (an in-flight task that holds nothing of its own).
- `GET /executions/{id}`: look the id up, answer its status and result.
- Finished results are kept up to `--max-retained` (oldest dropped first), like agent-server.
- Shutdown (lifespan): set the drain event and wait (bounded) for the tasks.

`--floor`: `POST /reasoners/echo` does what the contract requires of a sync run and nothing
more (docs/performance.md, the contract's floor): the input parsed and validated by a pydantic
model, an id, a record kept (bounded by `--max-retained`), the body run as a tracked task,
three Prometheus series counted (started, finished by status, duration), and the record
answered as JSON. Written with Starlette's own request and response, as the bare echo is, so
the floor less the echo is the contract's work alone. What agent-server adds beyond that is
its own cost.

Usage: python -m bench.baseline_app --port PORT [--max-retained N] [--floor]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
import uuid
from collections import OrderedDict
from collections.abc import AsyncIterator
from typing import Any

import uvicorn
from prometheus_client import CollectorRegistry, Counter, Histogram
from pydantic import BaseModel
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

SHUTDOWN_WAIT = 30.0


class Store:
    """Running tasks and finished results by id; the bare minimum of a registry."""

    def __init__(self, max_retained: int) -> None:
        self.max_retained = max_retained
        self.running: dict[str, asyncio.Task[None]] = {}
        self.finished: OrderedDict[str, Any] = OrderedDict()
        self.drain = asyncio.Event()

    def start(self, name: str, text: Any) -> str:
        key = uuid.uuid4().hex
        self.running[key] = asyncio.create_task(self._run(key, name, text))
        return key

    async def _run(self, key: str, name: str, text: Any) -> None:
        try:
            if name == "park":
                await self.drain.wait()
                result: Any = "drained"
            else:
                result = {"text": text}
        finally:
            del self.running[key]
        self.finished[key] = result
        if len(self.finished) > self.max_retained:
            self.finished.popitem(last=False)

    async def shutdown(self) -> None:
        self.drain.set()
        if self.running:
            await asyncio.wait(list(self.running.values()), timeout=SHUTDOWN_WAIT)


class EchoInput(BaseModel):
    text: str


class Floor:
    """The least a sync run must do: validate, an id, a bounded record, a tracked task, three
    series, the record as JSON."""

    def __init__(self, max_retained: int) -> None:
        self.max_retained = max_retained
        self.records: OrderedDict[str, dict[str, Any]] = OrderedDict()
        self.tasks: set[asyncio.Task[Any]] = set()
        registry = CollectorRegistry()
        self.started = Counter("floor_started", "Runs started.", ["reasoner"], registry=registry)
        self.finished = Counter(
            "floor_finished", "Runs finished.", ["reasoner", "status"], registry=registry
        )
        self.duration = Histogram(
            "floor_duration_seconds", "Run duration.", ["reasoner"], registry=registry
        )

    @staticmethod
    async def _echo(value: EchoInput) -> dict[str, Any]:
        return {"text": value.text}

    async def run(self, request: Request) -> Response:
        try:
            value = EchoInput.model_validate(await request.json())
        except ValueError as exc:
            return JSONResponse({"detail": str(exc)}, 422)
        key = uuid.uuid4().hex
        began = time.time()
        record: dict[str, Any] = {
            "execution_id": key,
            "reasoner": "echo",
            "status": "running",
            "result": None,
            "error": None,
            "created_at": began,
            "finished_at": None,
            "duration_seconds": None,
        }
        self.records[key] = record
        if len(self.records) > self.max_retained:
            self.records.popitem(last=False)
        self.started.labels("echo").inc()
        task = asyncio.create_task(self._echo(value))
        self.tasks.add(task)
        task.add_done_callback(self.tasks.discard)
        result = await task
        ended = time.time()
        record.update(
            status="succeeded", result=result, finished_at=ended, duration_seconds=ended - began
        )
        self.finished.labels("echo", "succeeded").inc()
        self.duration.labels("echo").observe(ended - began)
        return JSONResponse(record)


def build_app(max_retained: int, floor: bool = False) -> Starlette:
    store = Store(max_retained)
    contract = Floor(max_retained) if floor else None

    async def readyz(request: Request) -> Response:
        return JSONResponse({"status": "ready"})

    async def echo(request: Request) -> Response:
        if contract is not None:
            return await contract.run(request)
        body = await request.json()
        return JSONResponse({"text": body["text"]})

    async def start(request: Request) -> Response:
        name = request.path_params["name"]
        if name not in ("echo", "park"):
            return JSONResponse({"detail": "unknown reasoner"}, 404)
        body = await request.json()
        key = store.start(name, body.get("text"))
        return JSONResponse(
            {"execution_id": key, "status": "running"},
            202,
            headers={"Location": f"/executions/{key}"},
        )

    async def get_execution(request: Request) -> Response:
        key = request.path_params["execution_id"]
        if key in store.running:
            return JSONResponse({"execution_id": key, "status": "running", "result": None})
        if key in store.finished:
            result = store.finished[key]
            return JSONResponse({"execution_id": key, "status": "succeeded", "result": result})
        return JSONResponse({"detail": "unknown execution"}, 404)

    @contextlib.asynccontextmanager
    async def lifespan(app: Starlette) -> AsyncIterator[None]:
        yield
        await store.shutdown()

    return Starlette(
        routes=[
            Route("/readyz", readyz, methods=["GET"]),
            Route("/reasoners/echo", echo, methods=["POST"]),
            Route("/reasoners/{name}/async", start, methods=["POST"]),
            Route("/executions/{execution_id}", get_execution, methods=["GET"]),
        ],
        lifespan=lifespan,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--max-retained", type=int, default=10_000)
    parser.add_argument("--floor", action="store_true", help="the contract's sync run")
    args = parser.parse_args()
    config = uvicorn.Config(
        build_app(args.max_retained, args.floor),
        host="127.0.0.1",
        port=args.port,
        lifespan="on",
        log_config=None,
        access_log=False,
        timeout_graceful_shutdown=1,
    )
    uvicorn.Server(config).run()


if __name__ == "__main__":
    main()
