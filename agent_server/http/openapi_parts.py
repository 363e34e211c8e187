"""What the OpenAPI document's modules share: references, responses, the execution's
links, and the hoisting of a schema's `$defs` into the document's components."""

from __future__ import annotations

from typing import Any

REF_TEMPLATE = "#/components/schemas/{model}"


def ref(name: str) -> dict[str, str]:
    return {"$ref": f"#/components/schemas/{name}"}


#: A start's 202: the execution, or only its id to a caller that may not read it.
STARTED = {"anyOf": [ref("Execution"), ref("Accepted")]}


def json_body(schema: dict[str, Any], description: str) -> dict[str, Any]:
    return {"description": description, "content": {"application/json": {"schema": schema}}}


def error_response(description: str) -> dict[str, Any]:
    return json_body(ref("Error"), description)


#: The execution a response carries is reachable at these operations (OpenAPI links):
#: clients and stateful fuzzers follow them from a start to its poll, input, cancel and
#: delete.
EXECUTION_LINKS = {
    name: {"operationId": operation, "parameters": {"execution_id": "$response.body#/execution_id"}}
    for name, operation in [
        ("GetExecution", "getExecution"),
        ("GetExecutionInput", "getExecutionInput"),
        ("GetExecutionHistory", "getExecutionHistory"),
        ("CancelExecution", "cancelExecution"),
        ("DeleteExecution", "deleteExecution"),
        ("AnswerInput", "answerInput"),
    ]
}


def hoist(schema: dict[str, Any], components: dict[str, Any]) -> dict[str, Any]:
    components.update(schema.pop("$defs", {}))
    return schema
