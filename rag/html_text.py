"""HTML -> the main content of a documentation page, as heading paths and blocks.

A documentation page is mostly chrome: navigation bars, sidebars, "previous /
next" links, breadcrumbs, footers, permalink signs. This module keeps only what
the page is about:

1. Pick the main-content element, trying the containers that the common doc
   generators emit (Sphinx, MkDocs and Material, Docusaurus, Javadoc, DocBook,
   plain HTML5 `<main>`/`<article>`), else the `<body>`.
2. Drop boilerplate inside it (navigation, sidebars, footers, permalink anchors,
   cookie banners, scripts, forms) by tag, ARIA role and the class names of those
   generators.
3. Walk what is left in document order: every heading extends or cuts the
   heading path ("Reference > Configuration > Memory"); block elements end a
   paragraph; `<pre>` is kept verbatim as one block, line breaks and all.

Parsing uses selectolax's Lexbor engine (a C HTML5 parser; ~20x BeautifulSoup's
`html.parser`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from selectolax.lexbor import LexborNode

__all__ = ["MAIN_SELECTORS", "Page", "extract"]

# First match wins; each must hold most of the page's text to be trusted (see _main).
MAIN_SELECTORS = (
    "article.md-content__inner",  # MkDocs Material
    ".theme-doc-markdown",  # Docusaurus
    "div[role=main]",  # Sphinx (basic, alabaster, RTD), MkDocs
    "div.body",  # older Sphinx themes
    "main",  # HTML5, Javadoc 11+, Docusaurus, Furo
    "[role=main]",
    "article",
    "div.contentContainer",  # Javadoc 8
    "#main-content",
)

_BOILERPLATE = ", ".join(
    (
        "script, style, noscript, template, form, button, svg, iframe, object, nav, aside, footer",
        "[role=navigation], [role=search], [role=contentinfo], [aria-hidden=true]",
        # permalink signs next to headings (Sphinx, Docusaurus, MkDocs, GitHub-style anchors)
        "a.headerlink, a.hash-link, a.anchor, a.anchorjs-link, a.permalink, a.heading-anchor",
        # Sphinx chrome
        "div.related, div.sphinxsidebar, div.sphinxsidebarwrapper, div.footer, div.rst-footer-buttons",
        "div.wy-breadcrumbs, div.prev-next-area, div.bottom-of-page, div.clearer",
        "div.highlight-default > span.copybutton",
        # DocBook (PostgreSQL and many GNU manuals), Asciidoctor, Doxygen, Javadoc
        "div.navheader, div.navfooter, div.toc, #toc, #footer, #header-text, div.header, div.navbar",
        "div.top-nav, div.sub-nav, div.bottom-nav, div.breadcrumbs, ul.breadcrumb, .md-source-file",
        # consent and banners
        "[class*=cookie], [id*=cookie], [class*=consent], [class*=banner]",
    )
)

_HEADINGS = {"h1": 1, "h2": 2, "h3": 3, "h4": 4, "h5": 5, "h6": 6}
_BLOCKS = frozenset(
    "address article blockquote body caption center dd details dialog div dl dt fieldset figcaption "
    "figure h1 h2 h3 h4 h5 h6 header hgroup hr li main menu ol p section summary table tbody td tfoot "
    "th thead tr ul".split()
)
_SKIP = frozenset({"-comment", "script", "style", "noscript", "template", "head", "title", "meta", "link"})
_PERMALINK = re.compile(r"\s*[¶§#🔗]\s*$")
_SPACE = re.compile(r"\s+")
_BREAK = "\x00"  # a <br>: source newlines are only spaces, a <br> is a line break


@dataclass(frozen=True)
class Page:
    """What a page says: its title and (heading path, blocks) sections in reading order."""

    title: str
    sections: list[tuple[str, list[str]]]


def extract(html: str) -> Page:
    """The main content of one HTML page."""
    from selectolax.lexbor import LexborHTMLParser

    tree = LexborHTMLParser(html)
    title_node = tree.css_first("title")
    html_title = _clean(title_node.text(deep=True)) if title_node else ""
    root = _main(tree.body) if tree.body is not None else None
    if root is None:
        return Page(html_title, [])
    for junk in root.css(_BOILERPLATE):
        junk.decompose()
    if root.tag == "body":
        for junk in root.css("body > header, div.header, #header > #toc"):
            junk.decompose()
    walker = _Walker()
    walker.walk(root)
    walker.end_paragraph()
    walker.end_section()
    sections = walker.sections
    title = walker.h1 or _strip_site_suffix(html_title)
    if sections and walker.h1:  # the h1 is the title: paths start below it
        prefix = walker.h1
        sections = [(_below(path, prefix), blocks) for path, blocks in sections]
    return Page(title, [(path, blocks) for path, blocks in sections if blocks])


def _main(body: LexborNode) -> LexborNode:
    total = len(body.text(deep=True, strip=True))
    for selector in MAIN_SELECTORS:
        for node in body.css(selector):
            # A container is trusted only when it holds a fair share of the page; a tiny
            # <article> teaser or an empty <main> wrapper falls through to the next rule.
            if len(node.text(deep=True, strip=True)) >= 0.3 * total:
                return node
    return body


class _Walker:
    """Document-order walk: inline text joins into paragraphs, headings cut sections."""

    def __init__(self) -> None:
        self.trail: list[tuple[int, str]] = []
        self.h1 = ""
        self.sections: list[tuple[str, list[str]]] = []
        self._blocks: list[str] = []
        self._inline: list[str] = []

    def walk(self, node: LexborNode) -> None:
        for child in node.iter(include_text=True):
            tag = child.tag
            if tag == "-text":
                self._inline.append(child.text_content or "")
            elif tag in _SKIP:
                continue
            elif tag in _HEADINGS:
                self._heading(_HEADINGS[tag], _clean(child.text(deep=True)))
            elif tag == "pre":
                self.end_paragraph()
                code = (child.text(deep=True) or "").strip("\n")
                if code.strip():
                    self._blocks.append(code.rstrip())
            elif tag == "br":
                self._inline.append(_BREAK)
            elif tag in _BLOCKS:
                self.end_paragraph()
                self.walk(child)
                self.end_paragraph()
            else:  # inline: a, code, em, span, ...
                self.walk(child)

    def end_paragraph(self) -> None:
        lines = (_clean(line) for line in "".join(self._inline).split(_BREAK))
        text = "\n".join(line for line in lines if line)
        if text:
            self._blocks.append(text)
        self._inline.clear()

    def end_section(self) -> None:
        if self._blocks:
            self.sections.append((" > ".join(h for _, h in self.trail), self._blocks))
        self._blocks = []

    def _heading(self, level: int, text: str) -> None:
        if not text:
            return
        self.end_paragraph()
        self.end_section()
        if level == 1 and not self.h1:
            self.h1 = text
        while self.trail and self.trail[-1][0] >= level:
            self.trail.pop()
        self.trail.append((level, text))


def _clean(text: str | None) -> str:
    return _PERMALINK.sub("", _SPACE.sub(" ", text or "")).strip()


def _below(path: str, prefix: str) -> str:
    if path == prefix:
        return ""
    return path[len(prefix) + 3 :] if path.startswith(prefix + " > ") else path


def _strip_site_suffix(title: str) -> str:
    """'re — Regular expression operations — Python 3.11 documentation' -> the page's own part."""
    for sep in (" — ", " | ", " – ", " - "):
        if sep in title:
            return title.rsplit(sep, 1)[0].strip()
    return title
