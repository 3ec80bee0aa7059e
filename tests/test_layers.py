"""The import graph points down (docs/architecture.md, "The layers"), in the product and in the instruments.

The product, ``bv_blend/`` (what the wheel installs): a module imports from its own package or from a lower layer,
never sideways or up; nothing below the verl glue imports verl; and nothing imports an instrument. The instruments,
``instruments/`` (beside the product in the repository, not shipped): they may import the product, and among
themselves they point down too. Read from the source with ``ast``, so every import counts, including the lazy ones
inside functions."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "bv_blend"
INSTRUMENTS = ROOT / "instruments"
TESTS = ROOT / "tests"
# The product's tests: tests/bv_blend/<subpackage>/ (tests/bv_blend/verl/: the verl glue's).
# The instruments' are in tests/instruments/, the trainer runs on CPU in tests/e2e/; the rest of tests/ is the
# repository's own (packaging, set-up, layers) and its scripts'.
PRODUCT_TESTS = (TESTS / "bv_blend",)

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
    "strict_json": 0,                               # JSON without NaN or infinity (the summaries, the results)
    "allocation": 0,                                # the oracle (Knapsack) allocation of the regime's limits
    "child_run": 0,                                 # a runner's child comparison, stopped cleanly on an interrupt
    "rule": 1,                                      # the one rule that judges every arm (results/regime.md)
    "regime": 2,                                    # the regime's arms once, and the summary the rule reads
    "cpu": 3,                                       # verl's stock trainer on CPU (imports verl, never the glue)
    "run": 4,                                       # ONE verl run on CPU: settings, task, models, launch, reading
    "compare": 5,                                   # many runs: the arms, their results, the reports, the regime's
    "lab": 5,                                       # the logistic lab (simulated RLVR)
    "tuning": 5,                                    # each arm's own learning rate (issue 56)
    "cold_start": 5,                                # the cold start's task accepted or not (issue 56)
    "fair_verdict": 5,                              # the fair verdict's plan: arms, order, seeds, where state lives
    "demo": 6,                                      # the main job: one run of BV-Blend's cluster level at n = 2
    "campaign": 6,                                  # the fair verdict's runs still needed, in order, from its state
    "fair_verdict_report": 7,                       # the fair verdict's report, from whatever state exists
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
    """The check itself: the CPU platform importing the demo above it, or the plugin's glue, is caught; so is one
    verl run reaching up into the comparison (what the settings' old home, the demo's pipeline, made a circle of)."""
    module = INSTRUMENTS / "cpu" / "launch.py"
    source = "from instruments.demo import pipeline\nfrom bv_blend.verl import records\nfrom bv_blend.core import rows"
    monkeypatch.setattr(Path, "read_text", lambda self: source)
    assert _wrong_instrument_imports(module) == ["instruments.demo (layer 6 from layer 3)",
                                                 "bv_blend.verl (the plugin's glue, from cpu)"]
    run = INSTRUMENTS / "run" / "verl_run.py"
    monkeypatch.setattr(Path, "read_text", lambda self: "from instruments.compare.arms import ARMS\n")
    assert _wrong_instrument_imports(run) == ["instruments.compare.arms (layer 5 from layer 4)"]


# ------------------------------------------------------------------------------------------- no import cycle
def _module_name(path: Path) -> str:
    """``instruments/run/settings.py`` -> ``instruments.run.settings``; a package's ``__init__.py`` -> the package."""
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imported_modules(path: Path, modules: set[str], source: str | None = None) -> set[str]:
    """The modules of ``modules`` that ``path`` (or ``source``, as if it were there) imports, anywhere in it (at the
    top, inside a function, under ``TYPE_CHECKING``): ``from a.b import c`` counts as ``a.b.c`` where that is a
    module, else as ``a.b``."""
    package = _module_name(path) if path.name == "__init__.py" else _module_name(path).rpartition(".")[0]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text() if source is None else source)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the module's own package, up level - 1
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join([*anchor, *([base] if base else [])])
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for name in names:  # the longest prefix that is one of the modules (import a.b.c imports a.b.c)
            parts = name.split(".")
            target = next((".".join(parts[:i]) for i in range(len(parts), 0, -1) if ".".join(parts[:i]) in modules),
                          None)
            if target is not None and target != _module_name(path):
                found.add(target)
    return found


def _import_graph(root: Path) -> dict[str, set[str]]:
    paths = sorted(root.rglob("*.py"))
    modules = {_module_name(p) for p in paths}
    return {_module_name(p): _imported_modules(p, modules) for p in paths}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components of more than one module (Tarjan's algorithm): each holds an import cycle."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> Iterator[None]:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for target in sorted(graph.get(node, ())):
            if target not in index:
                yield from visit(target)
                low[node] = min(low[node], low[target])
            elif target in on_stack:
                low[node] = min(low[node], index[target])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))
        yield

    for node in sorted(graph):
        if node not in index:
            for _ in visit(node):
                pass
    return found


def test_no_import_cycle_among_the_instruments():
    """Every instrument module imports one way: no two of them import each other, directly or around a circle, not
    even lazily (a lazy import hides a circle; it does not remove it)."""
    graph = _import_graph(INSTRUMENTS)
    assert len(graph) > 20 and not (cycles := _cycles(graph)), f"import cycles among the instruments: {cycles}"


def test_the_cycle_check_sees_a_lazy_circle():
    """The check itself, on a made-up graph and on source: a module that a lower one imports back inside a function
    is a cycle."""
    assert _cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert _cycles({"a": {"b"}, "b": set()}) == []
    module = INSTRUMENTS / "regime.py"
    source = "from instruments import rule\ndef f():\n    from instruments.regime import ARMS\n"
    modules = {"instruments.regime", "instruments.rule"}
    assert _imported_modules(module, modules, source) == {"instruments.rule"}  # its own name is no edge
    sources = {module: source, INSTRUMENTS / "rule.py": "def g():\n    from instruments import regime\n"}
    graph = {_module_name(path): _imported_modules(path, modules, text) for path, text in sources.items()}
    assert _cycles(graph) == [["instruments.regime", "instruments.rule"]]


# ----------------------------------------------------------------------------- the product's tests import no instrument
def _test_module(name: str) -> Path | None:
    """The file of a ``tests.*`` module (a helper or another test module), if it is one."""
    path = ROOT.joinpath(*name.split("."))
    return path.with_suffix(".py") if path.with_suffix(".py").is_file() else None


def _instruments_reached(path: Path, seen: set[Path] | None = None) -> list[str]:
    """The instrument modules ``path`` imports, directly or through the test helpers it imports (``tests.*``)."""
    seen = set() if seen is None else seen
    if path in seen:
        return []
    seen.add(path)
    found = []
    for name in _imports(path):
        if name.split(".")[0] == "instruments":
            found.append(f"{name} ({path.relative_to(ROOT)})")
        elif name.split(".")[0] == "tests" and (helper := _test_module(name)) is not None:
            found += _instruments_reached(helper, seen)
    return found


def test_the_product_s_tests_import_no_instrument():
    """A product test runs where only the wheel is installed: it imports no instrument, not even through a helper."""
    modules = sorted(p for folder in PRODUCT_TESTS for p in folder.rglob("*.py"))
    wrong = {str(p.relative_to(ROOT)): names for p in modules if (names := _instruments_reached(p))}
    assert len(modules) > 30 and not wrong, f"the product's tests import instruments: {wrong}"


def test_the_check_sees_an_instrument_behind_a_test_helper(monkeypatch):
    """The check itself: a product test whose helper imports an instrument is caught, through the helper."""
    test, helper = TESTS / "bv_blend" / "blend" / "test_config.py", TESTS / "_estimator_helpers.py"
    sources = {test: "from tests._estimator_helpers import make\n",
               helper: "def make():\n    from instruments.run import tiny\n"}
    original = Path.read_text
    monkeypatch.setattr(Path, "read_text", lambda self, *a, **k: sources.get(self) or original(self, *a, **k))
    assert _instruments_reached(test) == ["instruments.run (tests/_estimator_helpers.py)"]
