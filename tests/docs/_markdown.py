"""Reading the repository's markdown for the docs tests: which files, their links, the repo paths they cite, and the
anchors GitHub gives their headings."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

FENCE = re.compile(r"^ {0,3}(```|~~~).*?^ {0,3}\1[^\n]*$", re.M | re.S)
INLINE_CODE = re.compile(r"(`+)(.+?)\1", re.S)
# [text](target) and ![alt](target), with an optional "title"; the text may hold one level of brackets.
LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE_DEFINITION = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s.*)?$", re.M)
HEADING = re.compile(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", re.M)
# A path into the repository as the guide cites it: one of the top folders, then a name with an extension or a
# trailing slash (so `bv_blend/weight_mean`, a metric, and `configs/paper/<name>`, a pattern, are not paths).
REPO_PATH = re.compile(
    r"(?:bv_blend|instruments|scripts|configs|results|docs|tests|hydra_plugins)/(?:[\w.-]+/)*"
    r"(?:[\w-]+\.(?:py|md|yaml|yml|json|png|sh|toml|txt|npz|csv))?"
)


def tracked_markdown() -> list[Path]:
    """Every tracked .md file (git's list: a file someone has but did not add is not the repository's)."""
    listed = subprocess.run(
        ["git", "ls-files", "-z", "--", "*.md"], cwd=ROOT, capture_output=True, text=True, check=True
    ).stdout
    return sorted(ROOT / name for name in listed.split("\0") if name and (ROOT / name).is_file())


def guide_markdown() -> list[Path]:
    """The user's guide: README.md and docs/*.md."""
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def without_code(text: str) -> str:
    """The text outside fenced blocks and inline code, where a link is a link."""
    return INLINE_CODE.sub(" ", FENCE.sub(" ", text))


def link_targets(text: str) -> list[str]:
    prose = without_code(text)
    return LINK.findall(prose) + REFERENCE_DEFINITION.findall(prose)


def is_external(target: str) -> bool:
    return bool(re.match(r"^[a-zA-Z][a-zA-Z0-9+.-]*:", target)) or target.startswith("//")


def slug(heading: str) -> str:
    """The anchor GitHub gives a heading: its text, lower case, punctuation but - and _ dropped, spaces as -."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = text.strip().lower()
    text = re.sub(r"[^\w\- ]", "", text)
    return text.replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found: set[str] = set()
    seen: dict[str, int] = {}
    for heading in HEADING.findall(FENCE.sub(" ", path.read_text())):
        base = slug(heading)
        count = seen.get(base, 0)
        seen[base] = count + 1
        found.add(base if count == 0 else f"{base}-{count}")
    return found


def broken_links(path: Path, text: str | None = None) -> list[str]:
    """Each relative link or image of ``path`` (or of ``text`` read as if it were ``path``'s) whose file, or whose
    heading in a markdown file, does not exist."""
    broken = []
    for target in link_targets(path.read_text() if text is None else text):
        if is_external(target):
            continue
        name, _, anchor = target.partition("#")
        resolved = (path.parent / name).resolve() if name else path
        if not resolved.exists():
            broken.append(f"{target}: no such file")
        elif anchor and resolved.suffix == ".md" and anchor.lower() not in anchors(resolved):
            broken.append(f"{target}: no heading with that anchor in {resolved.relative_to(ROOT)}")
    return broken


# The same in prose, where only a file name with its extension is taken for a path.
PROSE_PATH = re.compile(
    r"(?<![\w./~$-])((?:bv_blend|instruments|scripts|configs|results|docs|tests|hydra_plugins)/(?:[\w.-]+/)*"
    r"[\w-]+\.(?:py|md|yaml|yml|json|png|sh|toml|txt|npz|csv))(?![\w/-])"
)


def cited_paths(text: str) -> list[str]:
    """The repository paths ``text`` cites: in inline code (`scripts/demo.sh`, `bash scripts/test.sh`, ...), and
    file names in prose (results/benchmarks.md); not in fenced blocks, whose commands may name what they write."""
    paths = []
    for _, code in INLINE_CODE.findall(FENCE.sub(" ", text)):
        for token in code.split():
            token = re.sub(r"[:,;)]+[\d,-]*$", "", token)  # `file.py:49`, `file.py,`
            if REPO_PATH.fullmatch(token):
                paths.append(token)
    paths += PROSE_PATH.findall(re.sub(r"\]\([^)]*\)", "]", without_code(text)))  # link targets: test_links
    return paths


def missing_paths(path: Path) -> list[str]:
    return sorted({cited for cited in cited_paths(path.read_text()) if not (ROOT / cited).exists()})
