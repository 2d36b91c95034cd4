"""Every relative link in README.md and docs/*.md points to a file or folder in the repository.

A link's target is resolved against the folder of the page that holds it; web links (``http(s)://``, ``mailto:``)
and in-page anchors (``#section``) are skipped, and a ``#fragment`` after a path is dropped. Fenced code blocks and
inline code spans are not scanned (a ``[x](y)`` there is not a link).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.MULTILINE | re.DOTALL)
_CODE = re.compile(r"`[^`\n]*`")
_LINK = re.compile(r"!?\[[^\]]*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
_EXTERNAL = re.compile(r"^[a-z][a-z0-9+.-]*:", re.IGNORECASE)  # http:, https:, mailto:, ...


def links(text: str) -> list[str]:
    """The targets of the markdown links ``[text](target)`` in ``text``, outside code."""
    text = _CODE.sub("", _FENCE.sub("", text))
    return _LINK.findall(text)


def broken_links(page: Path) -> list[str]:
    """The relative link targets of ``page`` that name nothing in the repository."""
    broken = []
    for target in links(page.read_text(encoding="utf-8")):
        if target.startswith("#") or _EXTERNAL.match(target):
            continue
        path = target.split("#", 1)[0]
        resolved = (page.parent / path).resolve()
        if not resolved.exists() or not resolved.is_relative_to(ROOT):
            broken.append(target)
    return broken


def test_the_pages_exist() -> None:
    assert {"calibration.md", "data.md", "design.md"} <= {p.name for p in PAGES[1:]}


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_relative_links_point_to_files_in_the_repository(page: Path) -> None:
    assert broken_links(page) == [], f"{page.relative_to(ROOT)}: broken links"


def test_the_link_parser() -> None:
    text = (
        "[a](docs/a.md) ![b](b.png \"title\") [web](https://x.org/y) [top](#z) [c](c.md#part)\n"
        "`[not](code.md)`\n```\n[nor](fenced.md)\n```\n"
    )
    assert links(text) == ["docs/a.md", "b.png", "https://x.org/y", "#z", "c.md#part"]
