"""The docs' command extraction (issue 31): what `tests/e2e/docs_runner.py` cuts out of
README.md and docs/*.md, and that every command is run or allowlisted. The commands
themselves run in order on a fresh dev stack in tests/e2e/test_dev_stack.py."""

from __future__ import annotations

from tests.e2e.docs_runner import ALLOWLIST, Command, cut_commands, doc_commands, doc_files


def test_every_doc_command_is_run_or_allowlisted_and_fences_name_a_language() -> None:
    commands = [c for path in doc_files() for c in doc_commands(path)]
    assert any(c.text.startswith("connector-push save") for c in commands)
    # A placeholder left in a runnable block fails when it runs (exit 2: bad input).
    assert all(c.expected_exit in range(6) for c in commands)


def test_commands_are_cut_at_line_ends_outside_quotes_with_their_documented_exit() -> None:
    block = [
        "# a comment",
        "connector-push save --record-id c-004 \\",
        "  --user alice  # exit 3",
        'save=\'{"a": 1,',
        '       "b": 2}\'',
        "",
        "curl -s x | head -c 2",
    ]
    found = cut_commands(block, 10, "doc.md", console=False)
    assert [(c.where, c.expected_exit) for c in found] == [
        ("doc.md:11", 3),
        ("doc.md:13", 0),
        ("doc.md:16", 0),
    ]
    console = cut_commands(["$ connector-push audit", "output line"], 1, "doc.md", console=True)
    assert [c.text for c in console] == ["connector-push audit"]
    assert Command("x", "make dev   # comment", 0).allowlisted() == "make dev"
    assert Command("x", "make devx", 0).allowlisted() is None
    assert Command("x", "CHAOS_SEED=7 make chaos", 0).allowlisted() == "CHAOS_SEED="


def test_every_allowlist_entry_is_still_used() -> None:
    commands = [c for path in doc_files() for c in doc_commands(path)]
    used = {c.allowlisted() for c in commands}
    assert set(ALLOWLIST) <= used, f"allowlisted but no longer documented: {set(ALLOWLIST) - used}"
