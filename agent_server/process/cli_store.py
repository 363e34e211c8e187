"""`agent-server store migrate URL`: the Postgres store's schema brought up to this release
(docs/postgres.md). Idempotent: run twice, the second run has nothing to do and exits 0.
The URL is either spelling (`postgresql://`, `postgres://`), its password never printed."""

from __future__ import annotations

import asyncio
import sys

import click

from agent_server.process.cli_client import CONTEXT, ClientCommand, ClientGroup

#: The exit codes `store migrate` ends with, in its help.
EXITS = """\b
Exit codes: 0 migrated, or nothing to do; 1 the database cannot be reached;
2 a usage error, a URL that is not Postgres's, or a schema newer than this release."""


@click.group(name="store", cls=ClientGroup, context_settings=CONTEXT)
def store() -> None:
    """The shared store's upkeep."""


@store.command(cls=ClientCommand, epilog=EXITS)
@click.argument("url", envvar="AGENT_SERVER_STORE")
def migrate(url: str) -> None:
    """Apply the migrations a Postgres store's database lacks (exit 0, also when there is
    nothing to do; 2 for a schema newer than this release or a URL that is not Postgres's;
    1 when the database cannot be reached)."""
    if not url.startswith(("postgresql://", "postgres://")):
        click.echo("agent-server: store migrate takes a postgresql:// or postgres:// URL", err=True)
        sys.exit(2)
    # Only here: psycopg is imported by the command that needs it.
    import psycopg

    from agent_server.store.base import SchemaTooNew
    from agent_server.store.postgres import describe_url, migrate_url
    from agent_server.store.postgres.codec import scrub
    from agent_server.store.postgres.schema import latest

    where = describe_url(url)
    try:
        applied = asyncio.run(migrate_url(url))
    except SchemaTooNew as exc:
        click.echo(f"agent-server: {exc}", err=True)
        sys.exit(2)
    except (psycopg.Error, OSError) as exc:
        reason = scrub(url, str(exc).strip() or type(exc).__name__).splitlines()[0]
        click.echo(f"agent-server: cannot migrate Postgres at {where}: {reason}", err=True)
        sys.exit(1)
    if not applied:
        click.echo(f"{where}: schema at version {latest()}, nothing to do")
        return
    names = ", ".join(m.name for m in applied)
    click.echo(f"{where}: applied {names}; schema at version {applied[-1].version}")
