"""Sources focused on the question: whole sentences around the best match, within budget."""

from __future__ import annotations

from rag.answer import Source
from rag.focus import focus, focus_text

TEXT = (
    "The command reads the index. It writes a tree object. "
    "Use --no-verify to skip the pre-commit and commit-msg hooks. "
    "Hooks live in .git/hooks. The editor opens after that. Nothing else happens."
)


def idf(term: str) -> float:
    return {"no": 0.1, "verify": 3.0, "skip": 2.0, "hooks": 2.5, "commit": 0.5}.get(term, 1.0)


def test_the_kept_sentences_are_whole_around_the_best_match_and_within_budget() -> None:
    q = "How do I skip the hooks when I commit?"
    out = focus_text(TEXT, q, idf, 100)
    assert "Use --no-verify to skip the pre-commit and commit-msg hooks." in out
    assert len(out) <= 100 and out in TEXT.replace("  ", " ")  # a run of whole sentences, in order
    # It grows toward the neighbour that holds more of the question: the hooks' folder.
    assert "Hooks live in .git/hooks." in out and "The editor" not in out


def test_a_source_that_fits_or_no_budget_keeps_the_whole_chunk() -> None:
    assert focus_text(TEXT, "hooks", idf, 0) == TEXT
    assert focus_text(TEXT, "hooks", idf, len(TEXT)) == TEXT
    src = [Source(1, "git-commit.html", "OPTIONS", TEXT, 0.9)]
    (shown,) = focus(src, "skip hooks", idf, 80)
    assert (shown.n, shown.path, shown.heading) == (1, "git-commit.html", "OPTIONS")
    assert shown.text.startswith("Use --no-verify") and len(shown.text) <= 80


def test_a_code_block_is_kept_whole_or_left_out() -> None:
    text = "Run this:\n\n```\ngit commit --no-verify -m msg\n```\n\nIt skips the hooks. " + "Filler. " * 30
    out = focus_text(text, "skip hooks with no verify", idf, 90)
    assert out.count("```") in (0, 2)
