"""How the command line says things: a result as one line of JSON on stdout, a refusal or
an end as one line on stderr."""

from __future__ import annotations

import json
from typing import Any

import click


def say(what: object) -> None:
    """One line on stderr, whatever the text holds: an error's message may span lines (a
    reasoner's pydantic ValidationError: a header, a field, its message and a link), and
    each end but 0 of a verb writes one line. Its lines are joined with ": ", the links to
    pydantic's documentation left out."""
    lines = [line.strip() for line in str(what).splitlines()]
    kept = [line for line in lines if line and not line.startswith(DOCS_LINK)]
    click.echo(f"agent-server: {': '.join(kept)}", err=True)


#: How pydantic's messages end each error: a link, not part of what went wrong.
DOCS_LINK = "For further information visit "


def print_json(value: Any) -> None:
    click.echo(json.dumps(value, ensure_ascii=False))
