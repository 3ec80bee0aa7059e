"""The package's import graph points down (docs/architecture.md, "The layers"): a module imports from its own package
or from a lower layer, never sideways or up, and nothing below the verl glue imports verl. Read from the source with
``ast``, so every import counts, including the lazy ones inside functions."""

from __future__ import annotations

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[1] / "bv_blend"

# bv_blend's top-level packages and modules, bottom (0) to top; docs/architecture.md draws the same picture.
LAYERS: dict[str, int] = {
    "core": 0, "stats": 0, "machine": 0,            # what every estimator and instrument shares
    "history": 1, "companions": 1, "codebook": 1,   # prompt keys, tables, priors, sampler weights; companions; codebook
    "blend": 2, "spo": 2,                           # the estimators with a history
    "verl": 3, "cpu": 3,                            # the only glue that imports verl; verl's trainer on CPU
    "demo": 4, "paper": 4, "cli": 4,                # the CPU main job and comparison; the paper's kit; bv-blend
    "lab": 5,                                       # both labs (the token lab grows out of the demo's stand-in)
}  # fmt: skip
VERL_FREE_BELOW = LAYERS["verl"]


def _top(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module == "bv_blend":  # from bv_blend import stats
                names += [f"bv_blend.{alias.name}" for alias in node.names]
            else:
                names.append(node.module)
    return names


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py") if _top(p) in LAYERS)


def test_every_top_level_package_has_a_layer():
    tops = {_top(p) for p in PACKAGE.rglob("*.py")} - {"__init__"}
    assert tops <= set(LAYERS), f"give {sorted(tops - set(LAYERS))} a layer here and in docs/architecture.md"


def _wrong_imports(path: Path) -> list[str]:
    source = _top(path)
    wrong = []
    for name in _imports(path):
        parts = name.split(".")
        if parts[0] == "verl" and LAYERS[source] < VERL_FREE_BELOW:
            wrong.append(f"{name} (verl, below the glue)")
        if parts[0] == "bv_blend" and len(parts) > 1 and parts[1] in LAYERS:
            target = parts[1]
            if target != source and LAYERS[target] >= LAYERS[source]:
                wrong.append(f"{name} (layer {LAYERS[target]} from layer {LAYERS[source]})")
    return wrong


def test_imports_point_down():
    wrong = {str(p.relative_to(PACKAGE)): w for p in _modules() if (w := _wrong_imports(p))}
    assert _modules() and not wrong, f"imports sideways or up: {wrong}"


def test_the_check_sees_a_sideways_import(tmp_path, monkeypatch):
    """The check itself: the lazy import of the CPU harness that the offline priors' glue once had is caught."""
    module = PACKAGE / "verl" / "offline_priors.py"
    monkeypatch.setattr(Path, "read_text", lambda self: "def f():\n    from bv_blend.cpu import cpu_env\n")
    assert _wrong_imports(module) == ["bv_blend.cpu (layer 3 from layer 3)"]
