"""Main content out of real doc generators' HTML: chrome dropped, heading paths kept, code intact.

The pages in tests/data/html are cut-down copies of what Sphinx (Python's
manual), DocBook (PostgreSQL's), AsciiDoc (Git's man pages) and Docusaurus emit,
chrome included.
"""

from __future__ import annotations

from pathlib import Path

from rag.chunk import Chunker
from rag.html_text import extract
from rag.index import parse
from rag.ingest import scan

DATA = Path(__file__).parent / "data" / "html"
SPHINX, DOCBOOK, ASCIIDOC, DOCUSAURUS = (
    (DATA / f"{name}.html").read_text() for name in ("sphinx", "docbook", "asciidoc", "docusaurus")
)


def _all_text(page: object) -> str:
    return " ".join(b for _, blocks in page.sections for b in blocks)  # type: ignore[attr-defined]


def test_sphinx_page_keeps_content_and_drops_its_chrome() -> None:
    page = extract(SPHINX)
    assert page.title == "re — Regular expression operations"  # the h1, not the site suffix
    assert [path for path, _ in page.sections] == ["", "Module Contents > Flags"]
    text = _all_text(page)
    assert "similar to those found in Perl" in text and "Perform case-insensitive matching." in text
    for chrome in ("¶", "modules", "Previous topic", "Show Source", "Copyright", "DOCUMENTATION_OPTIONS"):
        assert chrome not in text
    code = page.sections[1][1][-1]
    assert code == 'a = re.compile(r"\\d +")\n\nb = re.compile(r"\\d+")'  # one block, blank line and all


def test_docbook_page_loses_navheader_navfooter_and_toc() -> None:
    page = extract(DOCBOOK)
    assert page.title == "20.4. Resource Consumption"
    text = _all_text(page)
    assert "shared memory buffers" in text and "shared_buffers (integer)" in text
    for chrome in ("Prev", "Next", "Home", "Write Ahead Log", "Chapter 20"):
        assert chrome not in text
    assert [path for path, _ in page.sections] == ["20.4. Resource Consumption > 20.4.1. Memory"]


def test_asciidoc_man_page_keeps_its_name_line_and_synopsis() -> None:
    page = extract(ASCIIDOC)
    assert page.title == "git-commit(1) Manual Page"
    paths = [path for path, _ in page.sections]
    assert paths == ["NAME", "SYNOPSIS", "OPTIONS"]
    assert page.sections[0][1] == ["git-commit - Record changes to the repository"]
    assert page.sections[1][1][0].splitlines()[1].startswith("           [--amend]")  # <pre> verbatim
    assert "Last updated" not in _all_text(page)


def test_docusaurus_page_keeps_the_article_only() -> None:
    page = extract(DOCUSAURUS)
    assert page.title == "Install"
    assert page.sections == [("", ["Run the installer once."]), ("GPU", ["Needs 24 GB."])]


def test_a_page_without_a_known_container_falls_back_to_body_minus_chrome() -> None:
    html = "<html><body><header>Site</header><nav>a | b</nav><h1>T</h1><p>Body text.</p><footer>c</footer>"
    page = extract(html)
    assert page.title == "T" and page.sections == [("", ["Body text."])]


def test_sources_beside_rendered_pages_are_indexed_once(tmp_path: Path) -> None:
    (tmp_path / "_sources" / "library").mkdir(parents=True)
    (tmp_path / "library").mkdir()
    (tmp_path / "library" / "re.html").write_text(SPHINX)
    (tmp_path / "_sources" / "library" / "re.rst.txt").write_text("re\n==\n\nThe same text.")
    (tmp_path / "git-commit.html").write_text(ASCIIDOC)
    (tmp_path / "git-commit.txt").write_text("git-commit(1)\n=============\n")
    (tmp_path / "notes.txt").write_text("Only here.")
    _, found = scan([tmp_path])
    assert sorted(f.name for f in found.files) == ["git-commit.html", "notes.txt", "re.html"]
    assert found.skipped == {"source of an HTML page beside it": 2}


def test_parallel_parsing_gives_what_one_process_gives(tmp_path: Path) -> None:
    for i in range(40):
        (tmp_path / f"p{i}.html").write_text(SPHINX.replace("Perl", f"Perl {i}"))
    root, found = scan([tmp_path])
    one = parse(found.files, root, Chunker(), workers=1)
    two = parse(found.files, root, Chunker(), workers=2)
    assert one == two and len(one) == 40
    assert [path for path, _, _ in two] == [f.relative_to(root).as_posix() for f in found.files]
