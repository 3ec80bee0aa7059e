"""The import graph points down (docs/architecture.md, "The layers"), in the product and in the instruments.

The product, ``bv_blend/`` (what the wheel installs): a module imports from its own package or from a lower layer,
never sideways or up; nothing below the verl glue imports verl; and nothing imports an instrument. The instruments,
``instruments/`` (beside the product in the repository, not shipped): they may import the product, and among
themselves they point down too. Read from the source with ``ast``, so every import counts, including the lazy ones
inside functions."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "bv_blend"
INSTRUMENTS = ROOT / "instruments"

# bv_blend's top-level packages, bottom (0) to top; docs/architecture.md draws the same picture.
LAYERS: dict[str, int] = {
    "core": 0,                                      # what every estimator shares
    "history": 1, "companions": 1, "codebook": 1,   # prompt keys, tables, priors, sampler weights; companions; codebook
    "blend": 2, "spo": 2,                           # the estimators with a history
    "verl": 3,                                      # the only glue that imports verl
    "paper": 4, "cli": 4,                          # the paper's kit; the bv-blend command
}  # fmt: skip
VERL_FREE_BELOW = LAYERS["verl"]

# instruments' top-level packages and modules, bottom (0) to top. Each may import any of the product.
INSTRUMENT_LAYERS: dict[str, int] = {
    "stats": 0, "machine": 0, "provenance": 0,      # statistics over seeds; the machine; the commits run
    "allocation": 0,                                # the oracle (Knapsack) allocation of the regime's limits
    "rule": 1,                                      # the one rule that judges every arm (results/regime.md)
    "regime": 2,                                    # the regime's arms once, and the summary the rule reads
    "cpu": 1,                                       # verl's stock trainer on CPU (imports verl, never the glue)
    "demo": 3,                                      # the CPU main job and the comparison harness (its regime summary)
    "lab": 4,                                       # the logistic lab (simulated RLVR)
}  # fmt: skip
# What an instrument must not import from the product: the CPU platform runs verl's trainer, whatever plugin it loads.
INSTRUMENT_FORBIDDEN: dict[str, tuple[str, ...]] = {"cpu": ("bv_blend.verl",)}


def _top(path: Path, root: Path) -> str:
    return path.relative_to(root).parts[0].removesuffix(".py")


def _imports(path: Path) -> list[str]:
    names = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            if node.module in ("bv_blend", "instruments"):  # from instruments import stats
                names += [f"{node.module}.{alias.name}" for alias in node.names]
            else:
                names.append(node.module)
    return names


def _modules(root: Path, layers: dict[str, int]) -> list[Path]:
    return sorted(p for p in root.rglob("*.py") if _top(p, root) in layers)


def test_every_top_level_package_has_a_layer():
    for root, layers in ((PACKAGE, LAYERS), (INSTRUMENTS, INSTRUMENT_LAYERS)):
        tops = {_top(p, root) for p in root.rglob("*.py")} - {"__init__"}
        assert tops <= set(layers), f"give {sorted(tops - set(layers))} a layer here and in docs/architecture.md"


def _upward(root: str, layers: dict[str, int], source: str, parts: list[str]) -> list[str]:
    """The import ``parts`` of a module of layer ``layers[source]`` under ``root``, if it goes sideways or up there."""
    if parts[0] != root or len(parts) < 2 or parts[1] not in layers:
        return []
    target = parts[1]
    if target == source or layers[target] < layers[source]:
        return []
    return [f"{'.'.join(parts)} (layer {layers[target]} from layer {layers[source]})"]


def _wrong_imports(path: Path) -> list[str]:
    """The product's rules."""
    source = _top(path, PACKAGE)
    wrong = []
    for name in _imports(path):
        parts = name.split(".")
        if parts[0] == "verl" and LAYERS[source] < VERL_FREE_BELOW:
            wrong.append(f"{name} (verl, below the glue)")
        if parts[0] == "instruments":
            wrong.append(f"{name} (an instrument, from the product)")
        wrong += _upward("bv_blend", LAYERS, source, parts)
    return wrong


def _wrong_instrument_imports(path: Path) -> list[str]:
    """The instruments' rules: down among themselves; the product is below them all."""
    source = _top(path, INSTRUMENTS)
    wrong = []
    for name in _imports(path):
        parts = name.split(".")
        if parts[0] == "verl" and INSTRUMENT_LAYERS[source] == 0:
            wrong.append(f"{name} (verl, from the instruments' shared layer)")
        if any(name == f or name.startswith(f + ".") for f in INSTRUMENT_FORBIDDEN.get(source, ())):
            wrong.append(f"{name} (the plugin's glue, from {source})")
        wrong += _upward("instruments", INSTRUMENT_LAYERS, source, parts)
    return wrong


def test_imports_point_down():
    wrong = {str(p.relative_to(PACKAGE)): w for p in _modules(PACKAGE, LAYERS) if (w := _wrong_imports(p))}
    assert _modules(PACKAGE, LAYERS) and not wrong, f"imports sideways or up: {wrong}"


def test_nothing_in_the_product_imports_an_instrument():
    modules = sorted(PACKAGE.rglob("*.py"))  # every module, the package's __init__ included
    wrong = {str(p.relative_to(PACKAGE)): names for p in modules
             if (names := [n for n in _imports(p) if n.split(".")[0] == "instruments"])}
    assert modules and not wrong, f"the product imports instruments (not in the wheel): {wrong}"


def test_the_instruments_imports_point_down():
    modules = _modules(INSTRUMENTS, INSTRUMENT_LAYERS)
    wrong = {str(p.relative_to(INSTRUMENTS)): w for p in modules if (w := _wrong_instrument_imports(p))}
    assert modules and not wrong, f"imports sideways or up: {wrong}"


def test_the_check_sees_a_sideways_import(monkeypatch):
    """The check itself: a lazy sideways import inside the product is caught."""
    module = PACKAGE / "verl" / "offline_priors.py"
    monkeypatch.setattr(Path, "read_text", lambda self: "def f():\n    from bv_blend.paper import configs\n")
    assert _wrong_imports(module) == ["bv_blend.paper (layer 4 from layer 3)"]


def test_the_check_sees_the_product_import_an_instrument(monkeypatch):
    """The check itself: the lazy import of the CPU harness that the offline priors' glue once had is caught, in
    both spellings."""
    module = PACKAGE / "verl" / "offline_priors.py"
    source = "def f():\n    from instruments.cpu import cpu_env\n    from instruments import machine\n"
    monkeypatch.setattr(Path, "read_text", lambda self: source)
    assert _wrong_imports(module) == ["instruments.cpu (an instrument, from the product)",
                                      "instruments.machine (an instrument, from the product)"]
    assert [n for n in _imports(module) if n.split(".")[0] == "instruments"] == ["instruments.cpu",
                                                                                 "instruments.machine"]


def test_the_check_sees_an_instrument_import_up(monkeypatch):
    """The check itself: the CPU platform importing the demo above it, or the plugin's glue, is caught."""
    module = INSTRUMENTS / "cpu" / "launch.py"
    source = "from instruments.demo import pipeline\nfrom bv_blend.verl import records\nfrom bv_blend.core import rows"
    monkeypatch.setattr(Path, "read_text", lambda self: source)
    assert _wrong_instrument_imports(module) == ["instruments.demo (layer 3 from layer 1)",
                                                 "bv_blend.verl (the plugin's glue, from cpu)"]
