"""Ingest: files under a root -> documents made of (heading, text) sections.

Reads .md, .txt, .rst, .html/.htm (BeautifulSoup, dropping scripts, styles and
navigation) and .pdf (pypdf). Anything else is skipped and counted. Links are
never followed out of the root: a symlink that resolves outside it is skipped.
"""

from __future__ import annotations

import hashlib
import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path

__all__ = ["SUPPORTED", "Document", "Scan", "Section", "load", "scan"]

SUPPORTED = (".md", ".markdown", ".txt", ".rst", ".html", ".htm", ".pdf")


@dataclass(frozen=True)
class Section:
    """A run of text under one heading."""

    heading: str
    text: str


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


def scan(paths: Iterable[Path]) -> tuple[Path, Scan]:
    """Walk folders (recursively) and files; returns the common root and the scan."""
    paths = [p.expanduser() for p in paths]
    missing = [str(p) for p in paths if not p.exists()]
    if missing:
        from rag.errors import ConfigError

        raise ConfigError(f"no such file or folder: {', '.join(missing)}")
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
    return root, result


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
            title, sections = "", [Section("", text)]
    rel = path.relative_to(root).as_posix()
    sections = [s for s in sections if s.text.strip()]
    return Document(
        path=rel,
        title=title or path.stem.replace("_", " ").replace("-", " "),
        sha256=hashlib.sha256(data).hexdigest(),
        sections=tuple(sections),
    )


_MD_HEADING = re.compile(r"^(#{1,6})\s+(.+?)\s*#*\s*$")


def _markdown(text: str) -> tuple[str, list[Section]]:
    title = ""
    trail: list[str] = []  # heading path, so a chunk keeps "Deploying > GPU memory"
    sections: list[Section] = []
    buf: list[str] = []
    in_code = False

    def flush() -> None:
        if buf:
            sections.append(Section(" > ".join(trail), "\n".join(buf).strip()))
            buf.clear()

    for line in text.splitlines():
        if line.lstrip().startswith("```"):
            in_code = not in_code
        m = None if in_code else _MD_HEADING.match(line)
        if m:
            flush()
            level, heading = len(m.group(1)), m.group(2).strip()
            if level == 1 and not title:
                title = heading
            trail[:] = [*trail[: level - 1], heading]
            continue
        buf.append(line)
    flush()
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
                sections.append(Section(heading, "\n".join(buf).strip()))
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
        sections.append(Section(heading, "\n".join(buf).strip()))
    return title, sections


def _html(text: str) -> tuple[str, list[Section]]:
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(text, "html.parser")
    for tag in soup(["script", "style", "nav", "header", "footer", "aside", "noscript", "template", "form"]):
        tag.decompose()
    title = soup.title.get_text(" ", strip=True) if soup.title else ""
    body = soup.body or soup
    sections: list[Section] = []
    heading = ""
    buf: list[str] = []
    for el in body.find_all(
        ["h1", "h2", "h3", "h4", "h5", "h6", "p", "li", "pre", "td", "blockquote", "dd", "dt"]
    ):
        if el.find_parent(["p", "li", "pre", "td", "blockquote"]) is not None:
            continue  # counted with its parent
        content = el.get_text(" ", strip=True)
        if not content:
            continue
        if el.name and el.name[0] == "h" and el.name[1:].isdigit():
            if buf:
                sections.append(Section(heading, "\n\n".join(buf)))
                buf = []
            heading = content
            title = title or content
        else:
            buf.append(content)
    if buf:
        sections.append(Section(heading, "\n\n".join(buf)))
    return title, sections


def _pdf(path: Path) -> tuple[str, list[Section]]:
    from pypdf import PdfReader

    reader = PdfReader(path)
    meta_title = (reader.metadata.title if reader.metadata else None) or ""
    sections = [
        Section(f"page {i}", text)
        for i, page in enumerate(reader.pages, 1)
        if (text := page.extract_text() or "").strip()
    ]
    return str(meta_title), sections
