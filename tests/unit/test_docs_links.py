"""The user docs hold together: every relative link in README.md and docs/*.md points to a file
that exists (and, with ``#anchor``, to a heading that page has, by GitHub's anchor rule), every
docs page is listed in the docs index, and the README stays short (under 300 lines).

Pure: reads the Markdown files only, no network (links with a scheme are not followed).
"""

from __future__ import annotations

import re
from collections import Counter
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[2]
README = REPO_ROOT / "README.md"
DOCS = REPO_ROOT / "docs"
README_MAX_LINES = 300

_FENCE = re.compile(r"^(```|~~~)")
_INLINE_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"(?<!!)\[[^\]\n]*\]\(([^)\s]+)\)")
_HEADING = re.compile(r"^(#{1,6})\s+(.*?)\s*#*\s*$")
_SCHEME = re.compile(r"^[a-z][a-z0-9+.-]*:", re.I)


def pages() -> list[Path]:
    """README.md and every page under docs/."""
    return [README, *sorted(DOCS.glob("*.md"))]


def _prose_lines(text: str) -> list[str]:
    """The lines outside fenced and indented code blocks, with inline code removed."""
    out: list[str] = []
    fenced = False
    previous_blank = True
    in_indented = False
    for line in text.splitlines():
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        if fenced:
            continue
        blank = not line.strip()
        # An indented block starts after a blank line; list continuations are indented less.
        if line.startswith("    ") and (previous_blank or in_indented):
            in_indented = True
        elif not blank:
            in_indented = False
        previous_blank = blank
        if not in_indented:
            out.append(_INLINE_CODE.sub("", line))
    return out


def links(text: str) -> list[str]:
    """The targets of the Markdown links in ``text``'s prose (images left out)."""
    return [m.group(1) for line in _prose_lines(text) for m in _LINK.finditer(line)]


def slug(heading: str) -> str:
    """GitHub's anchor for a heading's text: lower case, punctuation dropped, spaces to '-'."""
    text = re.sub(r"\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.replace("`", "").strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(text: str) -> set[str]:
    """Every heading anchor of a page, with GitHub's -1, -2 suffixes for repeated headings."""
    seen: Counter[str] = Counter()
    out: set[str] = set()
    fenced = False
    for line in text.splitlines():
        if _FENCE.match(line.lstrip()):
            fenced = not fenced
            continue
        match = None if fenced else _HEADING.match(line)
        if match is None:
            continue
        base = slug(match.group(2))
        out.add(base if not seen[base] else f"{base}-{seen[base]}")
        seen[base] += 1
    return out


def broken_links(page: Path) -> list[str]:
    """The relative links of ``page`` whose file or anchor does not exist."""
    broken: list[str] = []
    for target in links(page.read_text()):
        if _SCHEME.match(target):
            continue
        path_part, _, anchor = target.partition("#")
        dest = (page.parent / path_part).resolve() if path_part else page
        if not dest.exists():
            broken.append(f"{target} (no file {dest})")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest.read_text()):
            broken.append(f"{target} (no heading #{anchor} in {dest.name})")
    return broken


def test_every_relative_link_resolves() -> None:
    assert (DOCS / "README.md").exists()
    problems = {p.name: broken_links(p) for p in pages()}
    assert {name: bad for name, bad in problems.items() if bad} == {}
    assert sum(len(links(p.read_text())) for p in pages()) > 50  # the scan found the links


def test_the_readme_is_short_and_says_the_commands() -> None:
    text = README.read_text()
    assert len(text.splitlines()) < README_MAX_LINES
    assert "scripts/test.sh" in text  # .ci/run calls it
    assert "scripts/demo.sh" in text


def test_every_docs_page_is_in_the_index() -> None:
    index = DOCS / "README.md"
    listed = {(index.parent / t.partition("#")[0]).resolve() for t in links(index.read_text())}
    unlisted = [p.name for p in sorted(DOCS.glob("*.md")) if p != index and p not in listed]
    assert unlisted == []


def test_the_checker_finds_a_broken_link_and_a_missing_anchor(tmp_path: Path) -> None:
    tmp_path = tmp_path.resolve()
    page = tmp_path / "page.md"
    (tmp_path / "other.md").write_text("# Other page\n\n## A `code` heading, with: punctuation\n")
    page.write_text(
        "# Page\n\n## Twice\n\n## Twice\n\n"
        "[ok](other.md) [ok](other.md#a-code-heading-with-punctuation) [ok](#twice-1) "
        "[web](https://example.com/x) `[not a link](nowhere.md)`\n\n"
        "    [in a code block](nowhere.md)\n\n"
        "[gone](missing.md) [bad anchor](other.md#nope) [bad local](#twice-2)\n"
    )
    assert broken_links(page) == [
        f"missing.md (no file {tmp_path / 'missing.md'})",
        "other.md#nope (no heading #nope in other.md)",
        "#twice-2 (no heading #twice-2 in page.md)",
    ]
