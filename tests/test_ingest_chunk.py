"""Ingestion and chunking: formats, skips, links out of the root, structure, sizes, ids."""

from __future__ import annotations

import itertools
import os
from pathlib import Path

import pytest

from rag.chunk import Chunker, Tokens, chunk_document, count_tokens
from rag.errors import ConfigError
from rag.ingest import Document, Section, load, scan

HTML = """<html><head><title>Deploy guide</title><style>p{color:red}</style>
<script>var secret = "tracking";</script></head>
<body><nav><a href="/">Home</a> | <a href="/docs">Docs</a></nav>
<h1>Deploying</h1><p>Run <code>rag check</code> before every deploy.</p>
<h2>Memory</h2><ul><li>chat gets 0.32</li><li>guard gets 0.40</li></ul>
<footer>Copyright nobody</footer></body></html>"""


def _pdf(text: str) -> bytes:
    """A one-page PDF showing `text` in Helvetica, written by hand (no PDF writer needed)."""
    stream = f"BT /F1 12 Tf 72 720 Td ({text}) Tj ET".encode()
    objs = [
        b"<< /Type /Catalog /Pages 2 0 R >>",
        b"<< /Type /Pages /Kids [3 0 R] /Count 1 >>",
        b"<< /Type /Page /Parent 2 0 R /MediaBox [0 0 612 792] /Contents 4 0 R "
        b"/Resources << /Font << /F1 5 0 R >> >> >>",
        b"<< /Length %d >>\nstream\n%s\nendstream" % (len(stream), stream),
        b"<< /Type /Font /Subtype /Type1 /BaseFont /Helvetica >>",
    ]
    out, offsets = bytearray(b"%PDF-1.4\n"), []
    for i, body in enumerate(objs, 1):
        offsets.append(len(out))
        out += b"%d 0 obj\n%s\nendobj\n" % (i, body)
    xref = len(out)
    out += b"xref\n0 %d\n0000000000 65535 f \n" % (len(objs) + 1)
    out += b"".join(b"%010d 00000 n \n" % o for o in offsets)
    out += b"trailer\n<< /Size %d /Root 1 0 R >>\nstartxref\n%d\n%%%%EOF\n" % (len(objs) + 1, xref)
    return bytes(out)


@pytest.fixture
def docs(tmp_path: Path) -> Path:
    root = tmp_path / "docs"
    (root / "sub").mkdir(parents=True)
    (root / "guide.md").write_text(
        "# Guide\n\nIntro text.\n\n## Install\n\nRun make.\n\n```\n# not a heading\n```\n"
    )
    (root / "notes.txt").write_text("Plain notes about the stack.")
    (root / "sub" / "ref.rst").write_text(
        "Reference\n=========\n\nIntro.\n\nOptions\n-------\n\nThe --port flag.\n"
    )
    (root / "sub" / "page.html").write_text(HTML)
    (root / "manual.pdf").write_bytes(_pdf("The guard blocks unsafe answers."))
    (root / "image.png").write_bytes(b"\x89PNG")
    (root / "data.csv").write_text("a,b")
    (root / ".hidden.md").write_text("# secret")
    outside = tmp_path / "outside.md"
    outside.write_text("# Outside\n\nmust never be read")
    os.symlink(outside, root / "escape.md")
    return root


def test_scan_reads_supported_files_and_counts_the_rest(docs: Path) -> None:
    root, found = scan([docs])
    assert root == docs.resolve()
    names = sorted(f.name for f in found.files)
    assert names == ["guide.md", "manual.pdf", "notes.txt", "page.html", "ref.rst"]
    assert found.skipped == {".png": 1, ".csv": 1, "hidden": 1, "link outside the root": 1}


def test_scan_of_a_missing_path_says_which(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="nope"):
        scan([tmp_path / "nope"])


def test_markdown_keeps_title_and_heading_path(docs: Path) -> None:
    doc = load(docs / "guide.md", docs)
    assert doc.path == "guide.md" and doc.title == "Guide"
    assert [s.heading for s in doc.sections] == ["Guide", "Guide > Install"]
    assert "# not a heading" in doc.sections[1].text  # code fences are not headings


def test_rst_sections(docs: Path) -> None:
    doc = load(docs / "sub" / "ref.rst", docs)
    assert doc.path == "sub/ref.rst" and doc.title == "Reference"
    assert [(s.heading, s.text) for s in doc.sections] == [
        ("Reference", "Intro."),
        ("Options", "The --port flag."),
    ]


def test_html_drops_scripts_styles_and_navigation(docs: Path) -> None:
    doc = load(docs / "sub" / "page.html", docs)
    text = " ".join(s.text for s in doc.sections)
    assert doc.title == "Deploying"  # the page's h1; paths start below it
    assert "rag check" in text and "guard gets 0.40" in text
    for junk in ("tracking", "color:red", "Home", "Copyright"):
        assert junk not in text
    assert [s.heading for s in doc.sections] == ["", "Memory"]
    assert doc.sections[1].blocks == ("chat gets 0.32", "guard gets 0.40")


def test_pdf_text_per_page(docs: Path) -> None:
    doc = load(docs / "manual.pdf", docs)
    assert doc.sections == (Section("page 1", ("The guard blocks unsafe answers.",)),)


def _doc(text: str, heading: str = "Intro") -> Document:
    return Document("a.md", "Title", "0" * 64, (Section.of(heading, text),))


def test_chunks_fit_the_budget_and_overlap() -> None:
    paragraphs = [f"Paragraph {i} " + "word " * 20 + "." for i in range(20)]
    chunks = chunk_document(_doc("\n\n".join(paragraphs)), Chunker(max_tokens=200, overlap=60))
    assert len(chunks) > 3
    assert all(count_tokens(c.embed_text) <= 200 for c in chunks)
    for a, b in itertools.pairwise(chunks):
        assert a.text.split("\n\n")[-1] == b.text.split("\n\n")[0]  # a whole paragraph carried over
    assert all(count_tokens(c.embed_text) > 100 for c in chunks[:-1])  # filled, not a paragraph each


def test_a_paragraph_longer_than_a_chunk_is_cut_at_sentences() -> None:
    text = " ".join(f"Sentence number {i} says something about GPUs." for i in range(80))
    chunks = chunk_document(_doc(text), Chunker(max_tokens=120, overlap=20))
    assert len(chunks) > 3 and all(count_tokens(c.embed_text) <= 120 for c in chunks)
    assert all(c.text.rstrip().endswith(".") for c in chunks)


def test_a_code_block_stays_whole_when_it_fits_and_is_cut_at_lines_when_not() -> None:
    code = "\n".join(f"    call_{i}(alpha, beta)  # step {i}" for i in range(6))
    chunks = chunk_document(Document("a.md", "T", "0" * 64, (Section("Code", ("Intro.", code)),)))
    assert len(chunks) == 1 and code in chunks[0].text  # blank-line-free, indentation kept
    long_code = "\n".join(f"    call_{i}(alpha, beta)  # step {i}" for i in range(200))
    chunks = chunk_document(
        Document("a.md", "T", "0" * 64, (Section("Code", (long_code,)),)), Chunker(128, 0)
    )
    assert len(chunks) > 3 and all(count_tokens(c.embed_text) <= 128 for c in chunks)
    assert all(line.startswith("    call_") for c in chunks for line in c.text.split("\n"))
    assert "\n".join(c.text for c in chunks) == long_code  # cut between lines, nothing lost


def test_small_sections_of_a_page_share_a_chunk_and_keep_their_heading_paths() -> None:
    doc = Document(
        "a.md", "T", "0" * 64, (Section.of("One", "alpha " * 10), Section.of("One > Two", "beta " * 10))
    )
    [chunk] = chunk_document(doc)
    assert chunk.heading == "One"
    assert chunk.text.split("\n\n") == [("alpha " * 10).strip(), "One > Two", ("beta " * 10).strip()]
    assert chunk.embed_text.startswith("T > One\n")


def test_a_new_section_starts_a_chunk_only_when_the_last_is_full() -> None:
    sections = tuple(Section(f"S{i}", (f"section {i} " + "text " * 30,)) for i in range(6))
    chunks = chunk_document(Document("a.md", "T", "0" * 64, sections), Chunker(200, 30))
    assert 2 <= len(chunks) < 6
    assert all(count_tokens(c.embed_text) <= 200 for c in chunks)
    assert {c.heading for c in chunks} <= {f"S{i}" for i in range(6)}
    assert not any("section 0" in c.text and c.heading != "S0" for c in chunks)  # no overlap across sections


def test_chunk_ids_are_stable_and_change_with_content() -> None:
    a = chunk_document(_doc("same words here"))[0].id
    assert a == chunk_document(_doc("same words here"))[0].id
    assert a != chunk_document(_doc("other words here"))[0].id
    assert a != chunk_document(_doc("same words here", heading="Elsewhere"))[0].id


def _tokenizer_json(tmp_path: Path) -> Path:
    """A real tokenizer.json: one token per known word, [UNK] for the rest."""
    from tokenizers import Tokenizer, models, pre_tokenizers

    words = "[UNK] the guard engine takes a memory share of card".split()
    tok = Tokenizer(models.WordLevel({w: i for i, w in enumerate(words)}, unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.enable_truncation(8)  # what tokenizer.json files ship with; counting must ignore it
    path = tmp_path / "tokenizer.json"
    tok.save(str(path))
    return path


def test_sizes_are_counted_with_the_models_own_tokenizer(tmp_path: Path) -> None:
    path = _tokenizer_json(tmp_path)
    assert Tokens.find([tmp_path]) == path and Tokens.find([tmp_path / "nothing"]) is None
    tokens = Tokens(path)
    assert tokens.counts(["the guard", "zyxq ."]) == [2, 2]
    assert tokens.counts(["the " * 50]) == [50]  # not cut at the file's truncation
    text = "\n\n".join("the guard engine takes a memory share of the card" for _ in range(30))
    chunker = Chunker(64, 8, str(path))
    chunks = chunk_document(_doc(text), chunker)
    assert len(chunks) > 3
    assert all(n <= 64 - 3 for n in tokens.counts([c.embed_text for c in chunks]))
    assert chunker.describe()["counted_with"] == f"tokenizer:{path}"


def test_chunks_never_mix_pages() -> None:
    a = Document("a.md", "A", "0" * 64, (Section("x", ("alpha",)),))
    b = Document("b.md", "B", "1" * 64, (Section("x", ("beta",)),))
    assert [c.text for c in chunk_document(a) + chunk_document(b)] == ["alpha", "beta"]
