"""Input binding and output serialisation (docs/architecture.md), as a unit and over HTTP."""

from __future__ import annotations

import asyncio
import dataclasses
import inspect
import re
import threading
from collections.abc import AsyncIterator, Callable
from datetime import datetime
from typing import Any

import httpx
import pytest
from pydantic import BaseModel, ConfigDict, ValidationError

from agent_server import Agent, ExecutionContext
from agent_server.model.reasoner import Reasoner
from agent_server.model.reasoner_options import ReasonerDefinitionError, ReasonerOptions
from agent_server.model.scheduling import SessionPolicy
from tests.apps.tests_app import Text, make_agent


class Query(BaseModel):
    text: str
    limit: int = 3


class Loose(BaseModel):
    """A model with its own rule for extra keys."""

    model_config = ConfigDict(extra="allow")
    text: str


class Hit(BaseModel):
    text: str
    score: float


@pytest.fixture
async def client() -> AsyncIterator[httpx.AsyncClient]:
    agent = make_agent()
    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=agent), base_url="http://testserver"
    ) as http:
        yield http


# -- binding, as a unit --------------------------------------------------------------------------


def test_single_model_parameter_is_the_whole_body() -> None:
    async def search(q: Query, ctx: ExecutionContext) -> list[Hit]:
        return []

    reasoner = Reasoner(search, ReasonerOptions("search"))
    arguments = reasoner.bind({"text": "cats"})
    assert arguments == {"q": Query(text="cats", limit=3)}
    # The model's own schema, saying what the one rule for unknown keys does.
    assert reasoner.input_schema() == {**Query.model_json_schema(), "additionalProperties": False}
    with pytest.raises(ValidationError):
        reasoner.bind({"q": {"text": "cats"}})  # not wrapped in the parameter name


def test_keyword_parameters_with_defaults() -> None:
    async def sleep_then_echo(seconds: float, text: str = "done") -> dict[str, Any]:
        return {}

    reasoner = Reasoner(sleep_then_echo, ReasonerOptions("sleep"))
    assert reasoner.bind({"seconds": 1}) == {"seconds": 1.0, "text": "done"}
    assert reasoner.bind({"seconds": "2.5", "text": "x"}) == {"seconds": 2.5, "text": "x"}
    schema = reasoner.input_schema()
    assert schema["required"] == ["seconds"]
    assert schema["properties"]["text"]["default"] == "done"
    with pytest.raises(ValidationError) as unknown:
        reasoner.bind({"seconds": 1, "sconds": 2})
    assert unknown.value.errors()[0]["type"] == "extra_forbidden"
    with pytest.raises(ValidationError):
        reasoner.bind(None)  # `seconds` is required


def test_model_parameter_next_to_another_is_keyed_by_name() -> None:
    async def two(q: Query, n: int = 1) -> int:
        return n

    reasoner = Reasoner(two, ReasonerOptions("two"))
    arguments = reasoner.bind({"q": {"text": "x"}, "n": 2})
    assert arguments == {"q": Query(text="x"), "n": 2}


def test_context_parameter_is_never_read_from_the_body() -> None:
    async def needs_ctx(ctx: ExecutionContext) -> str:
        return ctx.execution_id

    reasoner = Reasoner(needs_ctx, ReasonerOptions("needs_ctx"))
    assert reasoner.bind(None) == {}
    assert "ctx" not in reasoner.input_schema().get("properties", {})
    with pytest.raises(ValidationError):
        reasoner.bind({"ctx": "forged"})


def test_no_parameters_accepts_an_empty_body_only() -> None:
    async def nothing() -> str:
        return "ok"

    reasoner = Reasoner(nothing, ReasonerOptions("nothing"))
    assert reasoner.bind(None) == {}
    assert reasoner.bind({}) == {}
    with pytest.raises(ValidationError):
        reasoner.bind({"x": 1})


def test_output_is_serialised_by_its_annotation() -> None:
    async def stamp() -> tuple[datetime, Hit]:
        raise NotImplementedError

    reasoner = Reasoner(stamp, ReasonerOptions("stamp"))
    value = (datetime(2026, 1, 2, 3, 4, 5), Hit(text="a", score=1))
    assert reasoner.serialize(value) == ["2026-01-02T03:04:05", {"text": "a", "score": 1.0}]
    assert reasoner.output_schema()["type"] == "array"
    # Validated against the annotation: a dict for a model is accepted, a wrong type is not.
    assert reasoner.serialize((value[0], {"text": "b", "score": 2})) == [
        "2026-01-02T03:04:05",
        {"text": "b", "score": 2.0},
    ]
    with pytest.raises(ValidationError):
        reasoner.serialize(("yesterday", value[1]))


def test_unannotated_output_is_plain_json() -> None:
    async def plain():  # type: ignore[no-untyped-def]
        return {"a": [1, 2]}

    reasoner = Reasoner(plain, ReasonerOptions("plain"))
    assert reasoner.serialize({"a": (1, 2)}) == {"a": [1, 2]}
    assert reasoner.output_schema() == {}


def test_description_defaults_to_the_first_docstring_line() -> None:
    async def documented() -> None:
        """First line.

        More text.
        """

    assert Reasoner(documented, ReasonerOptions("d")).description == "First line."
    assert Reasoner(documented, ReasonerOptions("d", description="given")).description == "given"


@pytest.mark.parametrize("kind", ["args", "kwargs", "positional"])
def test_unservable_signatures_are_refused_at_definition(kind: str) -> None:
    async def with_args(*items: int) -> None: ...

    async def with_kwargs(**items: int) -> None: ...

    async def positional(a: int, /) -> None: ...

    funcs: dict[str, Callable[..., Any]] = {
        "args": with_args,
        "kwargs": with_kwargs,
        "positional": positional,
    }
    with pytest.raises(ReasonerDefinitionError):
        Reasoner(funcs[kind], ReasonerOptions(kind))


def test_duplicate_reasoner_name_is_refused() -> None:
    agent = Agent("dupes")

    @agent.reasoner()
    async def same() -> None: ...

    with pytest.raises(ReasonerDefinitionError):
        agent.reasoner(name="same")(same)


@pytest.mark.parametrize(
    "name",
    ["", "  ", "x/async", "a/b", "a b", " a", "a\n", "%41", "a%2Fb", "caf\u00e9", ".hidden",
     "-x", "..", "a?b", "a#b", "a:b", "<lambda>", "x" * 129],
)  # fmt: skip
def test_names_the_routes_cannot_address_are_refused(name: str) -> None:
    """`x/async` would be served as `x`'s async route, a blank name only percent-encoded:
    a reasoner no request can reach is refused when it is registered, saying what is allowed."""
    agent = Agent("names")

    async def func() -> str:
        return "ran"

    with pytest.raises(ReasonerDefinitionError, match=re.escape("A-Z a-z 0-9 _ . -")):
        agent.reasoner(name=name)(func)
    assert agent.reasoners == {}


def test_a_function_whose_own_name_cannot_be_served_is_refused() -> None:
    with pytest.raises(ReasonerDefinitionError):
        Agent("lambdas").reasoner()(lambda: None)


@pytest.mark.parametrize("name", ["a", "_private", "9lives", "x.y-z_1", "v1.2", "A" * 128])
async def test_every_allowed_name_is_served_at_its_routes(name: str) -> None:
    agent = Agent("names")

    @agent.reasoner(name=name)
    async def func() -> str:
        return "ran"

    transport = httpx.ASGITransport(app=agent)
    async with httpx.AsyncClient(transport=transport, base_url="http://t") as client:
        listed = (await client.get("/reasoners")).json()
        assert [r["name"] for r in listed] == [name]
        run = await client.post(f"/reasoners/{name}")
        assert run.status_code == 200 and run.json()["reasoner"] == name
        started = await client.post(f"/reasoners/{name}/async")
        assert started.status_code == 202 and started.json()["reasoner"] == name
        await client.get(f"/executions/{started.json()['execution_id']}", params={"wait": 5})


def test_decorator_returns_the_function_unchanged() -> None:
    agent = Agent("plain")

    async def mine(text: str) -> str:
        return text

    assert agent.reasoner(name="m", description="d")(mine) is mine
    assert agent.reasoners["m"].describe()["description"] == "d"


# -- binding, through HTTP ------------------------------------------------------------------------


async def test_model_input_and_model_output(client: httpx.AsyncClient) -> None:
    response = await client.post("/reasoners/echo", json={"text": "hello"})
    assert response.status_code == 200
    assert response.json()["result"] == Text(text="hello").model_dump()


async def test_keyword_defaults_apply(client: httpx.AsyncClient) -> None:
    response = await client.post("/reasoners/sleep", json={"seconds": 0})
    assert response.status_code == 200
    assert response.json()["result"] == {"slept": 0.0}


async def test_context_is_injected_with_ids(client: httpx.AsyncClient) -> None:
    response = await client.post("/reasoners/whoami", headers={"X-Session-ID": "conv-7"})
    assert response.status_code == 200
    body = response.json()
    assert body["result"] == {
        "execution_id": body["execution_id"],
        "reasoner": "whoami",
        "session_id": "conv-7",
        "draining": False,
    }
    plain = (await client.post("/reasoners/whoami")).json()
    assert plain["result"]["session_id"] is None
    assert plain["result"]["execution_id"] == plain["execution_id"] != body["execution_id"]


async def test_def_reasoner_runs_in_a_worker_thread(client: httpx.AsyncClient) -> None:
    response = await client.post("/reasoners/thread_whoami", json={"label": "y"})
    assert response.status_code == 200
    body = response.json()
    assert body["result"]["execution_id"] == body["execution_id"]
    assert body["result"]["thread"].startswith("reasoner")
    assert body["result"]["thread"] != threading.current_thread().name


async def test_def_reasoners_run_concurrently(client: httpx.AsyncClient) -> None:
    """Two blocking `def` reasoners overlap: neither holds the event loop."""
    loop = asyncio.get_running_loop()
    began = loop.time()
    responses = await asyncio.gather(
        *(client.post("/reasoners/thread_sleep", json={"seconds": 0.3}) for _ in range(4))
    )
    assert all(r.status_code == 200 for r in responses)
    assert loop.time() - began < 1.0  # 4 x 0.3 s in sequence would be 1.2 s


@pytest.mark.parametrize(
    ("content", "content_type"), [(b"", None), (b"   ", None), (b"{}", "application/json")]
)
async def test_no_param_reasoner_accepts_an_empty_body(
    client: httpx.AsyncClient, content: bytes, content_type: str | None
) -> None:
    headers = {} if content_type is None else {"content-type": content_type}
    response = await client.post("/reasoners/no_params", content=content, headers=headers)
    assert response.status_code == 200
    assert response.json()["result"] == "ok"


async def test_unknown_keys_are_422(client: httpx.AsyncClient) -> None:
    response = await client.post("/reasoners/sleep", json={"seconds": 0, "extra": 1})
    assert response.status_code == 422
    errors = response.json()["detail"]
    assert [(e["loc"], e["type"]) for e in errors] == [(["extra"], "extra_forbidden")]
    ctx = await client.post("/reasoners/whoami", json={"ctx": {"execution_id": "forged"}})
    assert ctx.status_code == 422
    empty = await client.post("/reasoners/no_params", json={"x": 1})
    assert empty.status_code == 422


def test_a_model_input_refuses_unknown_keys_unless_it_says_otherwise() -> None:
    """One rule for unknown keys: refused (422), for a model input as for plain parameters;
    a model that sets `extra` itself keeps its own rule. The reasoner still gets an
    instance of the user's model, and the user's model is left as it was."""

    async def strict(q: Query) -> str:
        return q.text

    async def loose(q: Loose) -> str:
        return q.text

    refusing = Reasoner(strict, ReasonerOptions("strict"))
    with pytest.raises(ValidationError) as refused:
        refusing.bind({"text": "x", "unknown": 1})
    assert [(e["loc"], e["type"]) for e in refused.value.errors()] == [
        (("unknown",), "extra_forbidden")
    ]
    assert refusing.bind({"text": "x"}) == {"q": Query(text="x")}  # the user's own model
    assert Query.model_validate({"text": "x", "unknown": 1}).text == "x"  # left as it was
    kept = Reasoner(loose, ReasonerOptions("loose")).bind({"text": "x", "more": 2})["q"]
    assert kept.model_extra == {"more": 2}


def test_equal_requests_have_one_canonical_body() -> None:
    """What an Idempotency-Key compares: the body as the reasoner reads it."""

    async def sleep(seconds: float, text: str = "done") -> str:
        return text

    reasoner = Reasoner(sleep, ReasonerOptions("sleep"))
    same = [{"seconds": 5}, {"seconds": 5.0}, {"text": "done", "seconds": 5}]
    assert len({repr(reasoner.canonical(body)) for body in same}) == 1
    assert reasoner.canonical({"seconds": 5}) != reasoner.canonical({"seconds": 5.5})


async def test_output_serialised_by_annotation_over_http(client: httpx.AsyncClient) -> None:
    response = await client.post("/reasoners/report", json={"year": 2030})
    assert response.status_code == 200
    assert response.json()["result"] == {"when": "2030-01-02T03:04:05Z", "tags": ["a", "b"]}


async def test_unserialisable_result_is_failed() -> None:
    agent = Agent("bad-output")

    @agent.reasoner()
    async def wrong() -> int:
        return "not a number"  # type: ignore[return-value]

    @agent.reasoner()
    async def opaque():  # type: ignore[no-untyped-def]
        return object()

    async with httpx.AsyncClient(
        transport=httpx.ASGITransport(app=agent), base_url="http://testserver"
    ) as client:
        for name in ("wrong", "opaque"):
            response = await client.post(f"/reasoners/{name}")
            assert response.status_code == 500, response.text
            body = response.json()
            assert body["status"] == "failed"
            assert set(body["error"]) == {"type", "message"}


def test_timeout_and_retry_are_checked_where_the_reasoner_is_defined() -> None:
    from agent_server import RetryPolicy

    async def work() -> None:
        return None

    def blocking() -> None:
        return None

    assert Reasoner(work, ReasonerOptions("w", timeout=2)).timeout == 2.0
    for bad in (0, -1, float("nan"), 8 * 86_400, True):
        with pytest.raises(ReasonerDefinitionError):
            Reasoner(work, ReasonerOptions("w", timeout=bad))
    with pytest.raises(ReasonerDefinitionError, match="async def"):
        Reasoner(blocking, ReasonerOptions("b", timeout=1))
    with pytest.raises(ReasonerDefinitionError, match="RetryPolicy"):
        Reasoner(work, ReasonerOptions("w", retry=3))  # type: ignore[arg-type]
    policy = RetryPolicy(max_attempts=4, initial_delay=1, backoff=2, max_delay=3)
    assert [policy.delay(n) for n in (1, 2, 3)] == [1, 2, 3]
    assert policy.retries(ValueError(), 3) and not policy.retries(ValueError(), 4)
    assert not RetryPolicy(retry_on=(KeyError,)).retries(ValueError(), 1)
    for kwargs in ({"max_attempts": 0}, {"backoff": -1}, {"retry_on": [ValueError]}):
        with pytest.raises(ValueError):
            RetryPolicy(**kwargs)  # type: ignore[arg-type]


def test_a_concurrency_limit_is_checked_where_the_reasoner_is_defined() -> None:
    async def work() -> None:
        return None

    assert Reasoner(work, ReasonerOptions("w", max_concurrency=2)).concurrency_key is None
    limited = Reasoner(
        work, ReasonerOptions("w", max_concurrency=1, concurrency_key="header:X-Tenant")
    )
    assert limited.max_concurrency == 1
    for kwargs in (
        {"max_concurrency": 0},
        {"max_concurrency": True},
        {"concurrency_key": "session"},
        {"max_concurrency": 1, "concurrency_key": "tenant"},
        {"max_concurrency": 1, "concurrency_key": "header:bad name"},
    ):
        with pytest.raises(ReasonerDefinitionError):
            Reasoner(work, ReasonerOptions("w", **kwargs))  # type: ignore[arg-type]


def test_the_decorator_keywords_are_the_options_fields() -> None:
    """`@agent.reasoner`'s keywords are spelled out for editors and type checkers, and handed
    to ReasonerOptions as they came: the same names, defaults and annotations (`name` is the
    function's by default there, and the agent gives its own version)."""
    keywords = {
        param.name: (param.default, param.annotation)
        for param in inspect.signature(Agent.reasoner).parameters.values()
        if param.kind is param.KEYWORD_ONLY
    }
    fields = {
        field.name: (field.default, field.type)
        for field in dataclasses.fields(ReasonerOptions)
        if field.init and field.kw_only and field.name != "agent_version"
    }
    assert keywords == fields
    assert [p.name for p in inspect.signature(Agent.reasoner).parameters.values()][:2] == [
        "self",
        "name",
    ]


def test_options_settle_their_defaults_and_the_agent_passes_them_on() -> None:
    assert ReasonerOptions("r").attempts == 1
    assert ReasonerOptions("r", resumable=True).attempts == 3
    assert ReasonerOptions("r", resumable=True, max_attempts=5).attempts == 5
    with pytest.raises(ReasonerDefinitionError, match="only a resumable reasoner"):
        ReasonerOptions("r", max_attempts=2)
    with pytest.raises(ReasonerDefinitionError, match="session_policy is one of"):
        ReasonerOptions("r", session_policy="later")
    with pytest.raises(ReasonerDefinitionError, match="reasoner 'r': a version is"):
        ReasonerOptions("r", version="")
    agent = Agent("options", version="v2")

    @agent.reasoner(resumable=True, timeout=3, session_policy="enqueue", compatible=["v1"])
    async def work() -> None:
        """Works."""

    reasoner = agent.reasoners["work"]
    assert (reasoner.name, reasoner.description, reasoner.max_attempts) == ("work", "Works.", 3)
    assert reasoner.timeout == 3.0 and isinstance(reasoner.timeout, float)
    assert reasoner.session_policy is SessionPolicy.ENQUEUE
    assert reasoner.versions == reasoner.options.versions
    assert reasoner.options.agent_version == "v2" and reasoner.options.compatible == ["v1"]
