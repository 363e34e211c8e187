"""The route table (agent_server/http/route_table.py) is the one declaration of a route: the
routes `Api` mounts, the statuses metrics start at 0, and the OpenAPI document's operations
(their ids, summaries and statuses) all agree with it."""

from __future__ import annotations

from typing import Any

import pytest

from agent_server.http.api import ROUTE_STATUSES
from agent_server.http.auth import OPEN_PATHS
from agent_server.http.console_page import ConsolePage
from agent_server.http.cors import CORS_METHODS
from agent_server.http.docs_page import DocsPage
from agent_server.http.openapi import documented_paths, openapi_document
from agent_server.http.route_table import DOCUMENTED, ROUTES, RouteSpec
from agent_server.runtime.settings import Settings
from agent_server.service.access import ACTIONS
from tests.apps.tests_app import make_agent

AGENT = make_agent()
REASONERS = list(AGENT.reasoners.values())


def _documented(spec: RouteSpec, *, schedules: bool) -> bool:
    return spec.mount == "api" or (schedules and spec.mount == "schedules")


@pytest.mark.parametrize("schedules", [False, True])
@pytest.mark.parametrize("webhooks", [False, True])
def test_each_operation_documents_the_statuses_it_declares(schedules: bool, webhooks: bool) -> None:
    """Without authentication, exactly the declared `documented` statuses; with it, the 401
    of every operation but the probes' and the 403 of one that asks `@agent.authorize`."""
    for secured in (False, True):
        document = openapi_document(
            "t", REASONERS, secured=secured, webhooks=webhooks, schedules=schedules
        )
        paths = document["paths"]
        for spec in ROUTES:
            for path in documented_paths(spec, REASONERS):
                for op in spec.operations:
                    method = op.method.lower()
                    if op.operation_id is None or not _documented(spec, schedules=schedules):
                        assert method not in paths.get(path, {}), (op.method, path)
                        continue
                    expected = set(op.documented)
                    if secured and path not in OPEN_PATHS:
                        expected |= {401, 403} if op.asks else {401}
                    answers = {int(status) for status in paths[path][method]["responses"]}
                    assert answers == expected, (op.method, path, secured)


def test_every_operation_of_the_document_is_declared_with_its_id_and_summary() -> None:
    """No operation of the document but a declared one, named and summed up as declared."""
    document = openapi_document("t", REASONERS, secured=True, webhooks=True, schedules=True)
    declared: dict[tuple[str, str], Any] = {}
    for spec in ROUTES:
        for op in spec.operations:
            if op.operation_id is not None:
                for path in documented_paths(spec, REASONERS):
                    declared[(path, op.method.lower())] = (spec, op)
    found = {(path, method) for path, item in document["paths"].items() for method in item}
    assert found == set(declared)
    for (path, method), (spec, op) in declared.items():
        operation = document["paths"][path][method]
        name = path.split("/")[2] if spec.per_reasoner else ""
        assert operation["operationId"] == op.operation_id.replace("{name}", name)
        reasoner = AGENT.reasoners.get(name)
        if reasoner is None or reasoner.description is None or path.endswith("/async"):
            assert operation["summary"] == op.summary.replace("{name}", name)
    operations = [operation for item in document["paths"].values() for operation in item.values()]
    ids = [operation["operationId"] for operation in operations]
    assert len(ids) == len(set(ids))
    links = [
        link["operationId"]
        for operation in operations
        for response in operation["responses"].values()
        for link in response.get("links", {}).values()
    ]
    assert links and set(links) <= set(ids)


def test_every_route_api_mounts_is_declared_and_every_declared_route_is_mounted() -> None:
    """A route added to `Api` without its declaration, or a declaration served by nothing,
    fails here: with every part on, the mounted routes are the declared ones, in order."""
    agent = make_agent(Settings(mcp=True, docs=True, console=True))
    api = agent.api()
    assert api.schedules is not None and api.mcp is not None
    mounted = [(route.path, sorted(set(route.methods or ()) - {"HEAD"})) for route in api.routes()]
    assert mounted == [(spec.path, sorted(spec.methods)) for spec in ROUTES]
    bare = make_agent(Settings(docs=False, console=False))
    assert {route.path for route in bare.api().routes()} == {
        spec.path for spec in ROUTES if spec.mount in ("api", "schedules")
    }


def test_the_statuses_metrics_expect_are_the_declared_ones() -> None:
    declared = {(op.method, spec.path): op.statuses for spec in ROUTES for op in spec.operations}
    assert {key: value for key, value in declared.items() if value} == ROUTE_STATUSES
    # Every route but /mcp (JSON-RPC's answers) has its ordinary answers counted from 0.
    assert {path for (_, path), value in declared.items() if not value} == {"/mcp"}


def test_declarations_are_well_formed() -> None:
    """One declaration per path and method; the actions asked are `@agent.authorize`'s;
    a documented operation belongs to a documented part; CORS allows every method."""
    keys = [(spec.path, op.method) for spec in ROUTES for op in spec.operations]
    assert len(keys) == len(set(keys))
    methods = set()
    for spec in ROUTES:
        for op in spec.operations:
            methods.add(op.method)
            assert set(op.asks) <= ACTIONS, (op.method, spec.path)
            assert op.summary, (op.method, spec.path)
            if op.operation_id is not None:
                assert spec.mount in DOCUMENTED
                assert op.documented, (op.method, spec.path)
    assert set(CORS_METHODS) == methods
    # The pages' open paths are the ones their routes serve.
    pages = {spec.path for spec in ROUTES if spec.mount in ("docs", "console")}
    assert {"/docs", "/console"} <= pages
    assert "/docs" in DocsPage.open_paths and "/console" in ConsolePage.open_paths
