"""Every relative link in README.md and docs/**/*.md points to a file or folder in the repository, and the manual's
nav (``mkdocs.yml``) lists every page under docs/.

A link's target is resolved against the folder of the page that holds it; web links (``http(s)://``, ``mailto:``)
and in-page anchors (``#section``) are skipped, and a ``#fragment`` after a path is dropped. Fenced code blocks and
inline code spans are not scanned (a ``[x](y)`` there is not a link).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
DOCS = ROOT / "docs"
PAGES = [ROOT / "README.md", *sorted(DOCS.rglob("*.md"))]

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
    pages = {p.relative_to(DOCS).as_posix() for p in PAGES[1:]}
    assert {"calibration.md", "data.md", "design.md", "recipes.md", "index.md"} <= pages
    assert {f"papers/{name}.md" for name in ("adaserve", "turbospec", "laps_sd", "nightjar", "goodspeed")} <= pages


def nav_pages(nav: object) -> list[str]:
    """The page paths of an mkdocs ``nav`` (a list of pages, ``{title: page}`` and ``{title: [sections]}``)."""
    if isinstance(nav, str):
        return [nav]
    if isinstance(nav, list):
        return [p for item in nav for p in nav_pages(item)]
    if isinstance(nav, dict):
        return [p for value in nav.values() for p in nav_pages(value)]
    raise TypeError(f"unexpected nav entry {nav!r}")


def test_the_nav_lists_every_page() -> None:
    """No page under docs/ is orphaned, and the nav names no page that is not there (mkdocs.yml parsed as plain YAML:
    no mkdocs needed)."""
    config = yaml.safe_load((ROOT / "mkdocs.yml").read_text(encoding="utf-8"))
    assert config["docs_dir"] == "docs" and config["strict"] is True
    listed = nav_pages(config["nav"])
    assert len(listed) == len(set(listed)), "a page is listed twice"
    assert sorted(listed) == sorted(p.relative_to(DOCS).as_posix() for p in PAGES[1:])


def test_the_nav_parser() -> None:
    assert nav_pages(["a.md", {"B": "b.md"}, {"C": [{"D": "c/d.md"}, "e.md"]}]) == ["a.md", "b.md", "c/d.md", "e.md"]


@pytest.mark.parametrize("page", PAGES, ids=[p.relative_to(ROOT).as_posix() for p in PAGES])
def test_relative_links_point_to_files_in_the_repository(page: Path) -> None:
    assert broken_links(page) == [], f"{page.relative_to(ROOT)}: broken links"


@pytest.mark.parametrize("page", PAGES[1:], ids=[p.relative_to(ROOT).as_posix() for p in PAGES[1:]])
def test_the_manual_links_only_inside_docs(page: Path) -> None:
    """MkDocs' strict build fails on a link out of docs/ (it is not a page of the site): a repository file is named in
    code font instead (`conf/exp/smoke.yaml`)."""
    outside = [t for t in links(page.read_text(encoding="utf-8")) if not t.startswith("#") and not _EXTERNAL.match(t)
               and not (page.parent / t.split("#", 1)[0]).resolve().is_relative_to(DOCS)]
    assert outside == [], f"{page.relative_to(ROOT)}: links out of docs/"


def test_the_link_parser() -> None:
    text = (
        "[a](docs/a.md) ![b](b.png \"title\") [web](https://x.org/y) [top](#z) [c](c.md#part)\n"
        "`[not](code.md)`\n```\n[nor](fenced.md)\n```\n"
    )
    assert links(text) == ["docs/a.md", "b.png", "https://x.org/y", "#z", "c.md#part"]
