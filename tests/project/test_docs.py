"""The documentation: the generated reference pages match the code they come
from (the same check ``mkdocs build`` runs through tools/docs_hooks.py), the README is a
short front page whose set-up commands are the docs' own, and the pages the site's
navigation names exist."""

from __future__ import annotations

import re
import sys

import pytest
import yaml

from tests.support.paths import REPO

pytestmark = pytest.mark.fast

sys.path.insert(0, str(REPO / "tools"))

from docs_reference import stale_pages  # noqa: E402 (tools/ is not a package)


def test_generated_reference_pages_are_current() -> None:
    assert stale_pages() == [], "run python tools/docs_reference.py"


def test_readme_is_a_short_front_page_with_the_docs_set_up_commands() -> None:
    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) < 200
    started = (REPO / "docs" / "get-started" / "index.md").read_text()
    for line in readme.splitlines():
        if line.startswith("python") and "epfleet compile" in line:
            assert line in started, line
    assert "python3 -m venv .venv" in readme


def nav_pages(node: object) -> list[str]:
    if isinstance(node, str):
        return [node] if node.endswith(".md") else []
    if isinstance(node, list):
        return [page for item in node for page in nav_pages(item)]
    if isinstance(node, dict):
        return [page for value in node.values() for page in nav_pages(value)]
    return []


def test_every_page_in_the_navigation_exists_and_every_page_is_in_it() -> None:
    config = yaml.safe_load((REPO / "mkdocs.yml").read_text())
    listed = set(nav_pages(config["nav"]))
    on_disk = {str(p.relative_to(REPO / "docs")) for p in (REPO / "docs").rglob("*.md")}
    assert listed == on_disk


def test_readme_links_to_pages_that_exist() -> None:
    readme = (REPO / "README.md").read_text()
    for target in re.findall(r"\]\((docs/[^)#]+)\)", readme):
        assert (REPO / target).is_file(), target


def test_the_cli_references_code_blocks_fit_the_text_column() -> None:
    """About 80 characters of code fit the docs' text column with both sidebars shown; the
    help was rendered at 100 and 20 of its 21 blocks (22 now) ran off the column's edge."""
    page = (REPO / "docs" / "reference" / "cli.md").read_text(encoding="utf-8")
    blocks = re.findall(r"```text\n(.*?)```", page, re.S)
    assert len(blocks) == 22
    wide = [line for block in blocks for line in block.splitlines() if len(line) > 80]
    assert wide == []
