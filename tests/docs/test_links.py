"""Every relative link and image in every tracked markdown file leads to a file that exists (and, into a markdown
file, to one of its headings), and every repository path the README and the user's guide cite in code exists: a file
moved or renamed without its docs fails here."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.docs._markdown import (
    ROOT,
    anchors,
    broken_links,
    cited_paths,
    guide_markdown,
    link_targets,
    missing_paths,
    slug,
    tracked_markdown,
)


def test_the_markdown_is_found() -> None:
    names = {path.relative_to(ROOT).as_posix() for path in tracked_markdown()}
    assert {"README.md", "docs/estimator.md", "results/README.md"} <= names


@pytest.mark.parametrize("path", tracked_markdown(), ids=lambda path: path.relative_to(ROOT).as_posix())
def test_every_relative_link_resolves(path: Path) -> None:
    assert not broken_links(path), f"{path.relative_to(ROOT)} links to what is not there: {broken_links(path)}"


@pytest.mark.parametrize("path", guide_markdown(), ids=lambda path: path.relative_to(ROOT).as_posix())
def test_every_repository_path_the_guide_cites_exists(path: Path) -> None:
    missing = missing_paths(path)
    assert not missing, f"{path.relative_to(ROOT)} cites paths that do not exist: {missing}"


def test_a_broken_link_fails() -> None:
    readme_path = ROOT / "README.md"
    readme = readme_path.read_text()
    assert not broken_links(readme_path, readme)
    for broken in (
        readme.replace("(docs/estimator.md)", "(docs/estimatr.md)", 1),
        readme.replace("(results/benchmarks_compare_pretrained_lm.png)", "(results/nothing.png)", 1),
        readme.replace("(docs/history.md#when-to-use-which", "(docs/history.md#when-to-use-whch", 1),
    ):
        assert broken != readme
        assert len(broken_links(readme_path, broken)) == 1, "a broken link passed"
    page = ROOT / "docs" / "estimator.md"
    assert "## As a library" in page.read_text() and "as-a-library" in anchors(page)


def test_code_is_not_a_link_and_external_links_are_not_checked() -> None:
    text = '[a](https://example.com) `[b](nowhere.md)`\n```\n[c](nowhere.md)\n```\n[d](README.md#x "title")'
    assert link_targets(text) == ["https://example.com", "README.md#x"]


def test_headings_get_githubs_anchors() -> None:
    assert slug("The demo: `bash scripts/demo.sh`") == "the-demo-bash-scriptsdemosh"
    assert slug("Options (`algorithm.bv_blend.*`)") == "options-algorithmbv_blend"
    assert slug("When to use which: what to run, by regime") == "when-to-use-which-what-to-run-by-regime"


def test_cited_paths_are_read_from_code_spans() -> None:
    text = (
        "`bash scripts/demo.sh`, `bv_blend/core/rows.py:49`, `bv_blend/weight_mean`, `configs/paper/<name>`, "
        "`bv_blend/verl/`, scripts/not_in_code.py\n```\npython scripts/in_a_block.py\n```"
    )
    assert cited_paths(text) == ["scripts/demo.sh", "bv_blend/core/rows.py", "bv_blend/verl/", "scripts/not_in_code.py"]
