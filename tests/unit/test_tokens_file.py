"""The tokens file's parser: what a line gives, and every hostile line refused by its number
and reason, never by its text (which holds a token)."""

from __future__ import annotations

from pathlib import Path

import pytest

from agent_server.identity.principal import Principal
from agent_server.identity.tokens import TokenError
from agent_server.identity.tokens_file import (
    MAX_TOKENS_FILE_BYTES,
    parse_tokens,
    read_tokens_file,
)

SECRET = "s3cr3t-0123456789abcdef"


def test_each_line_gives_a_principal() -> None:
    table = parse_tokens(
        "\ufeff# a comment\n"
        "\n"
        f"{SECRET}-a alice\n"
        f"  {SECRET}-b\tbob   team-1 \r\n"
        f"{SECRET}-c carol - admin,notes:read\n"
        f"{SECRET}-d dave team-2 agent-server:admin\n"
        "   # an indented comment\n"
    )
    assert len(table) == 4
    assert table.find(f"{SECRET}-a".encode()) == Principal("alice")
    assert table.find(f"{SECRET}-b".encode()) == Principal("bob", "team-1")
    carol = table.find(f"{SECRET}-c".encode())
    assert carol == Principal("carol", None, {"admin", "notes:read"})
    assert carol is not None and carol.tenant == "~carol" and carol.is_admin
    dave = table.find(f"{SECRET}-d".encode())
    assert dave is not None and dave.tenant == "team-2" and dave.is_admin
    assert table.find(SECRET.encode()) is None
    assert table.find(b"") is None


def test_a_byte_order_mark_is_no_part_of_the_first_token(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_bytes(b"\xef\xbb\xbf" + f"{SECRET} alice\n".encode())
    assert read_tokens_file(str(path)).find(SECRET.encode()) == Principal("alice")


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        (f"{SECRET}\n", "line 1: needs a token and an identity"),
        (f"{SECRET} a t s extra\n", "line 1: has 5 fields"),
        (f"ok-token a\n{SECRET} a\n{SECRET} b\n", "line 3: repeats the token of line 2"),
        (f"{SECRET}\x1cx alice\n", "line 1: api token must be printable ASCII"),
        (f"{SECRET}\u2028x alice\n", "line 1: api token must be printable ASCII"),
        (f"caf\u00e9-{SECRET} alice\n", "line 1: api token must be printable ASCII"),
        (f"{SECRET}\x00 alice\n", "line 1: api token must be printable ASCII"),
        (f"{'x' * 5000} alice\n", "line 1: api token must be 1 to 4096 characters"),
        (f"{SECRET} al\x1bice\n", "line 1: the identity must hold no control characters"),
        (f"{SECRET} alice te\x85am\n", "line 1: the tenant must hold no control characters"),
        (f"{SECRET} {'i' * 300}\n", "line 1: the identity must be at most 256 characters"),
        (f"{SECRET} alice - admin,,read\n", "line 1: each scope must be a non-empty string"),
        (f"{SECRET} alice - ,\n", "line 1: each scope must be a non-empty string"),
        ("# only a comment\n\n", "holds no token"),
        ("", "holds no token"),
    ],
    ids=[
        "no-identity",
        "five-fields",
        "repeated-token",
        "separator-in-token",
        "line-separator-in-token",
        "non-ascii-token",
        "nul-in-token",
        "huge-token",
        "escape-in-identity",
        "c1-control-in-tenant",
        "long-identity",
        "empty-scope",
        "only-commas",
        "only-comments",
        "empty",
    ],
)
def test_hostile_files_are_refused_by_line_never_quoting_it(text: str, reason: str) -> None:
    with pytest.raises(TokenError) as refused:
        parse_tokens(text)
    message = str(refused.value)
    assert reason in message
    assert SECRET not in message
    assert "alice" not in message


def test_a_file_too_large_or_not_text_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "tokens"
    path.write_bytes(f"{SECRET} alice\n".encode() * (MAX_TOKENS_FILE_BYTES // 20))
    with pytest.raises(TokenError, match="is larger than"):
        read_tokens_file(str(path))
    path.write_bytes(b"\xff\xfe" + SECRET.encode() + b" alice\n")
    with pytest.raises(TokenError, match="is not UTF-8 text"):
        read_tokens_file(str(path))
    with pytest.raises(TokenError, match="cannot be read"):
        read_tokens_file(str(tmp_path / "missing"))
    with pytest.raises(TokenError, match="cannot be read"):
        read_tokens_file(str(tmp_path))


def test_a_principal_checks_its_names_and_keeps_claims_out_of_its_repr() -> None:
    principal = Principal("alice", scopes=("read",), claims={"email": "alice@example.test"})
    assert principal.tenant == "~alice"  # its own: apart from a tenant named "alice"
    assert Principal("alice", "alice").tenant != principal.tenant
    assert principal.claims["email"] == "alice@example.test"
    assert "example.test" not in repr(principal)
    with pytest.raises(TypeError):
        principal.claims["email"] = "x"  # type: ignore[index]
    assert hash(principal) == hash(Principal("alice", "~alice", {"read"}))  # read back
    with pytest.raises(ValueError, match="must not begin with '~'"):
        Principal("alice", "~bob")  # no one names another's own tenant
    with pytest.raises(ValueError, match="identity"):
        Principal("")
    with pytest.raises(ValueError, match="tenant"):
        Principal("alice", "bad\ntenant")
    with pytest.raises(TypeError, match="not one string"):
        Principal("alice", scopes="admin")
    assert not Principal("a", scopes={"administrator"}).is_admin


def test_an_identity_without_a_tenant_never_shares_one_named_like_it(tmp_path: Path) -> None:
    """A user `acme` (no tenant) and the members of a tenant `acme` are apart; a named tenant
    cannot take the mark of an identity's own."""
    path = tmp_path / "tokens"
    path.write_text(f"{SECRET} alice acme\n{SECRET}-x acme\n")
    tokens = read_tokens_file(str(path))
    member = tokens.find(SECRET.encode())
    namesake = tokens.find(f"{SECRET}-x".encode())
    assert member is not None and namesake is not None
    assert (member.tenant, namesake.tenant) == ("acme", "~acme")
    path.write_text(f"{SECRET} alice ~acme\n")
    with pytest.raises(TokenError, match="must not begin with '~'"):
        read_tokens_file(str(path))
