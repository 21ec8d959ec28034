"""Ingest: files under a root -> documents made of (heading path, blocks) sections.

Reads .md, .txt, .rst, .html/.htm (main content only, see rag.html_text) and
.pdf (pypdf). A block is a paragraph, a list item or a whole code block; the
chunker packs blocks and splits inside one only when it must. Anything else is
skipped and counted. Links are never followed out of the root: a symlink that
resolves outside it is skipped. A source file published beside its rendered
page (Sphinx's `_sources/x.rst.txt` or `x.txt` next to `x.html`) is skipped, so
a documentation folder's text is indexed once.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["SUPPORTED", "Document", "Scan", "Section", "load", "require_paths", "scan"]

SUPPORTED = (".md", ".markdown", ".txt", ".rst", ".html", ".htm", ".pdf")


@dataclass(frozen=True)
class Section:
    """The blocks under one heading path ("Reference > Configuration > Memory")."""

    heading: str
    blocks: tuple[str, ...]

    @classmethod
    def of(cls, heading: str, text: str) -> Section:
        """A section from plain text: blocks are its blank-line separated paragraphs."""
        return cls(heading, tuple(p.strip() for p in _BLANK_LINE.split(text) if p.strip()))

    @property
    def text(self) -> str:
        return "\n\n".join(self.blocks)


_BLANK_LINE = re.compile(r"\n\s*\n")


@dataclass(frozen=True)
class Document:
    """One file: where it lives (relative to the root), its title, its sections."""

    path: str
    title: str
    sha256: str
    sections: tuple[Section, ...]


@dataclass
class Scan:
    """Which files an ingest run found, and what it skipped and why."""

    files: list[Path] = field(default_factory=list)
    skipped: Counter[str] = field(default_factory=Counter)


def require_paths(paths: Iterable[Path]) -> None:
    """ConfigError naming every path given that does not exist."""
    missing = [str(p) for p in paths if not p.expanduser().exists()]
    if missing:
        from rag.errors import ConfigError

        raise ConfigError(f"no such file or folder: {', '.join(missing)}")


def scan(paths: Iterable[Path]) -> tuple[Path, Scan]:
    """Walk folders (recursively) and files; returns the common root and the scan."""
    paths = [p.expanduser() for p in paths]
    require_paths(paths)
    resolved = [p.resolve() for p in paths]
    root = resolved[0] if len(resolved) == 1 and resolved[0].is_dir() else _common_root(resolved)
    result = Scan()
    seen: set[Path] = set()
    for p in resolved:
        candidates = sorted(p.rglob("*")) if p.is_dir() else [p]
        for f in candidates:
            if f.is_dir():
                continue
            real = f.resolve()
            if not real.is_relative_to(root):
                result.skipped["link outside the root"] += 1
                continue
            if any(part.startswith(".") for part in f.relative_to(root).parts):
                result.skipped["hidden"] += 1
                continue
            if f.suffix.lower() not in SUPPORTED:
                result.skipped[f"{f.suffix.lower() or 'no extension'}"] += 1
                continue
            if real not in seen:
                seen.add(real)
                result.files.append(f)
    rendered = {f.with_suffix("") for f in result.files if f.suffix.lower() in (".html", ".htm")}
    kept = [f for f in result.files if not _source_of_rendered(f, rendered)]
    result.skipped["source of an HTML page beside it"] += len(result.files) - len(kept)
    result.skipped += Counter()  # drops a zero count
    result.files = kept
    return root, result


_SOURCE_SUFFIXES = (".txt", ".rst", ".md", ".markdown")


def _source_of_rendered(f: Path, rendered: set[Path]) -> bool:
    """x.txt / x.rst / x.md beside x.html, or Sphinx's _sources/x.rst.txt for x.html."""
    if f.suffix.lower() not in _SOURCE_SUFFIXES:
        return False
    stem = f.with_suffix("")
    if stem in rendered:
        return True
    parts = f.parts
    if "_sources" not in parts:
        return False
    i = len(parts) - 1 - parts[::-1].index("_sources")
    page = Path(*parts[:i], *parts[i + 1 :]).with_suffix("")  # _sources/a/b.rst.txt -> a/b.rst
    return page in rendered or page.with_suffix("") in rendered


def _common_root(paths: list[Path]) -> Path:
    parents = [p if p.is_dir() else p.parent for p in paths]
    root = parents[0]
    while not all(p.is_relative_to(root) for p in parents):
        root = root.parent
    return root


def load(path: Path, root: Path) -> Document:
    """Read one supported file into a Document."""
    data = path.read_bytes()
    suffix = path.suffix.lower()
    if suffix == ".pdf":
        title, sections = _pdf(path)
    else:
        text = data.decode("utf-8", errors="replace")
        if suffix in (".html", ".htm"):
            title, sections = _html(text)
        elif suffix == ".rst":
            title, sections = _rst(text)
        elif suffix in (".md", ".markdown"):
            title, sections = _markdown(text)
        else:
            title, sections = "", [Section.of("", text)]
    rel = path.relative_to(root).as_posix()
    sections = [s for s in sections if s.blocks]
    return Document(
        path=rel,
        title=title or path.stem.replace("_", " ").replace("-", " "),
        sha256=hashlib.sha256(data).hexdigest(),
        sections=tuple(sections),
    )


_MD_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")
_FENCE = re.compile(r"^\s*(```|~~~)")


def _markdown(text: str) -> tuple[str, list[Section]]:
    title = ""
    trail: list[str] = []  # heading path, so a chunk keeps "Deploying > GPU memory"
    sections: list[Section] = []
    blocks: list[str] = []
    buf: list[str] = []
    in_code = False

    def end_block() -> None:
        if "".join(buf).strip():
            blocks.append("\n".join(buf).strip("\n"))
        buf.clear()

    def end_section() -> None:
        end_block()
        if blocks:
            sections.append(Section(" > ".join(trail), tuple(blocks)))
            blocks.clear()

    for line in text.splitlines():
        if _FENCE.match(line):
            if not in_code:
                end_block()  # a fenced block is one block, blank lines and all
            buf.append(line)
            in_code = not in_code
            if not in_code:
                end_block()
            continue
        if in_code:
            buf.append(line)
            continue
        m = _MD_HEADING.match(line)
        if m:
            end_section()
            level, heading = len(m.group(1)), m.group(2).strip()
            if level == 1 and not title:
                title = heading
            trail[:] = [*trail[: level - 1], heading]
        elif not line.strip():
            end_block()
        else:
            buf.append(line)
    end_section()
    return title, sections


_RST_UNDERLINE = re.compile(r"^([=\-~^\"'`#*+.:_])\1{2,}\s*$")


def _rst(text: str) -> tuple[str, list[Section]]:
    lines = text.splitlines()
    title, heading = "", ""
    sections: list[Section] = []
    buf: list[str] = []
    i = 0
    while i < len(lines):
        line = lines[i]
        nxt = lines[i + 1] if i + 1 < len(lines) else ""
        if line.strip() and _RST_UNDERLINE.match(nxt) and len(nxt.strip()) >= len(line.strip()):
            if buf:
                sections.append(Section.of(heading, "\n".join(buf)))
                buf = []
            heading = line.strip()
            title = title or heading
            i += 2
            continue
        if (
            _RST_UNDERLINE.match(line)
            and nxt.strip()
            and i + 2 < len(lines)
            and _RST_UNDERLINE.match(lines[i + 2])
        ):
            i += 1  # overlined title: the next iteration sees "title / underline"
            continue
        buf.append(line)
        i += 1
    if buf:
        sections.append(Section.of(heading, "\n".join(buf)))
    return title, sections


def _html(text: str) -> tuple[str, list[Section]]:
    from rag.html_text import extract

    page = extract(text)
    return page.title, [Section(heading, tuple(blocks)) for heading, blocks in page.sections]


def _pdf(path: Path) -> tuple[str, list[Section]]:
    from pypdf import PdfReader

    reader = PdfReader(path)
    meta_title = (reader.metadata.title if reader.metadata else None) or ""
    sections = [
        Section.of(f"page {i}", text)
        for i, page in enumerate(reader.pages, 1)
        if (text := page.extract_text() or "").strip()
    ]
    return str(meta_title), sections
