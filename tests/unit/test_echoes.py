"""What a refusal says back (agent_server/model/echoes.py): a bounded prefix of any value,
every character escaped, and a bounded list of the names allowed."""

from __future__ import annotations

from agent_server.model.echoes import MAX_NAMED, SHOWN_LENGTH, one_of, shown


def test_shown_cuts_any_value_to_about_its_bound() -> None:
    for value in ("x" * 900_000, ["y" * 10_000] * 1000, {"k" * 5000: "v" * 5000}, 10**5000):
        assert len(shown(value)) < 4 * SHOWN_LENGTH + 200, type(value)
    assert shown("abc") == "'abc'"
    assert shown("\ud800\n") == "'\\ud800\\n'"  # escaped: a log or a terminal is safe


def test_one_of_lists_at_most_its_bound_then_counts_the_rest() -> None:
    names = [f"n{i:03d}" for i in range(MAX_NAMED + 7)]
    said = one_of(reversed(names))
    assert said.startswith("n000, n001") and said.endswith("and 7 more")
    assert said.count(",") == MAX_NAMED - 1
    assert one_of(["b", "a"]) == "a, b"
    assert one_of([]) == "none"
