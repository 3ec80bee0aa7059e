"""Check every key our yaml files set against what verl 0.9.1 declares AND reads.

Two questions per key (a dotted path such as ``actor_rollout_ref.actor.grad_clip``):

1. Does verl declare it? The schema is verl's own ``ppo_trainer`` config, composed by hydra from the installed
   package (the same tree ``configs/bv_blend.yaml`` inherits). A key below a mapping that verl declares empty
   (``model.override_config: {}``, ``rollout.engine_kwargs.vllm: {}``) is free-form: verl passes it through, so
   only the mapping itself is checked.
2. Does verl read it? Declared is not enough: verl 0.9.1 declares ``actor.grad_clip`` on ``FSDPActorConfig`` but
   never reads it (the clip norm is ``actor.optim.clip_grad``). Every read site of the key's last name in
   verl's source is found with ``ast``: ``x.name``, ``x["name"]``, ``x.get("name")``, ``getattr(x, "name")``,
   a select path ending in ``.name``, or a ``${...name}`` interpolation in verl's yaml. A read ``self.name``
   inside a class counts only when that class is in the method resolution order of the dataclass verl builds
   for the key's section (the ``_target_`` above it), so ``OptimizerConfig``'s own ``self.grad_clip`` does not
   count as a read of the actor's ``grad_clip``.

``algorithm.bv_blend.*`` is ours, not verl's: it is checked against the options bv_blend reads
(``BVBlendConfig`` and the glue's ``GlueOptions``).

Run on a file: ``python -m tests._verl_schema configs/paper/qwen25_math_7b.yaml``.
"""

from __future__ import annotations

import ast
import importlib
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

OUR_NAMESPACE = ("algorithm", "bv_blend")
# Top-level entries of a config file that are hydra's, not the trainer's.
HYDRA_ENTRIES = frozenset({"defaults", "hydra"})


@dataclass(frozen=True)
class Finding:
    """One key that verl (or bv_blend) will not act on: ``kind`` is ``unknown`` or ``unread``."""

    key: str
    kind: str
    detail: str

    def __str__(self) -> str:
        return f"{self.key}: {self.kind}: {self.detail}"


@dataclass(frozen=True)
class _ReadSite:
    file: str
    line: int
    self_in_class: str | None  # the enclosing class when the read is ``self.<name>``, else None


# ----------------------------------------------------------------------------------------- verl's schema


def _verl_root() -> Path:
    import verl

    return Path(verl.__file__).resolve().parent


@lru_cache(maxsize=1)
def verl_schema() -> DictConfig:
    """verl's ``ppo_trainer`` config as hydra composes it from the installed package (unresolved)."""
    from hydra import compose, initialize_config_dir

    with initialize_config_dir(str(_verl_root() / "trainer" / "config"), version_base=None):
        return compose(config_name="ppo_trainer")


def _declares(node: Any, key: str) -> bool:
    # not `key in node`: OmegaConf answers False for a key whose value is ??? (verl's rollout.name is one)
    return isinstance(node, DictConfig) and key in list(node)


def _node(tree: Any, parts: Iterable[str]) -> tuple[Any, int]:
    """The deepest node of ``tree`` along ``parts`` and how many parts were matched."""
    node, depth = tree, 0
    for part in parts:
        if _declares(node, part):
            node = node._get_node(part)  # the node itself: ``???`` and interpolations stay unresolved
            depth += 1
        else:
            break
    return node, depth


def _target_class(parts: list[str]) -> type | None:
    """The dataclass verl builds for the section holding ``parts`` (nearest ``_target_`` above the leaf)."""
    schema = verl_schema()
    target = None
    node: Any = schema
    for part in parts[:-1]:
        if not _declares(node, part):
            break
        node = node._get_node(part)
        if _declares(node, "_target_"):
            target = node._get_node("_target_")._value()
    if not target:
        return None
    module, _, name = str(target).rpartition(".")
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


# ----------------------------------------------------------------------------------------- verl's reads


class _ReadCollector(ast.NodeVisitor):
    """Records every place a name is read: attributes, subscripts, ``.get``/``getattr`` and select paths."""

    def __init__(self, file: str, index: dict[str, list[_ReadSite]]) -> None:
        self.file, self.index, self.classes = file, index, []

    def _add(self, name: str, line: int, self_in_class: str | None = None) -> None:
        self.index.setdefault(name, []).append(_ReadSite(self.file, line, self_in_class))

    def visit_ClassDef(self, node: ast.ClassDef) -> None:
        self.classes.append(node.name)
        self.generic_visit(node)
        self.classes.pop()

    def visit_Attribute(self, node: ast.Attribute) -> None:
        if isinstance(node.ctx, ast.Load):
            on_self = isinstance(node.value, ast.Name) and node.value.id == "self" and self.classes
            self._add(node.attr, node.lineno, self.classes[-1] if on_self else None)
        self.generic_visit(node)

    def visit_Subscript(self, node: ast.Subscript) -> None:
        if isinstance(node.ctx, ast.Load) and isinstance(node.slice, ast.Constant) and isinstance(
            node.slice.value, str
        ):
            self._add(node.slice.value, node.lineno)
        self.generic_visit(node)

    def visit_Call(self, node: ast.Call) -> None:
        func = node.func
        is_get = isinstance(func, ast.Attribute) and func.attr in ("get", "pop", "setdefault", "select")
        is_getattr = isinstance(func, ast.Name) and func.id in ("getattr", "hasattr")
        if is_get or is_getattr:
            for arg in node.args[:2]:
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str):
                    self._add(arg.value.rsplit(".", 1)[-1], node.lineno)  # "a.b.name" select paths too
        self.generic_visit(node)


_INTERPOLATION = re.compile(r"\$\{(?:oc\.select:)?([A-Za-z0-9_.]+)")


@lru_cache(maxsize=1)
def verl_read_sites() -> dict[str, list[_ReadSite]]:
    """Every name read anywhere in the installed verl (python source and yaml interpolations)."""
    root = _verl_root()
    index: dict[str, list[_ReadSite]] = {}
    for path in sorted(root.rglob("*.py")):
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        except (SyntaxError, UnicodeDecodeError):
            continue
        _ReadCollector(str(path.relative_to(root)), index).visit(tree)
    for path in sorted((root / "trainer" / "config").rglob("*.yaml")):
        for line_no, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            for match in _INTERPOLATION.finditer(line):
                name = match.group(1).rsplit(".", 1)[-1]
                index.setdefault(name, []).append(_ReadSite(str(path.relative_to(root)), line_no, None))
    return index


def read_sites(key: str) -> list[_ReadSite]:
    """The places in verl that read ``key`` (see the module docstring for what counts)."""
    parts = key.split(".")
    target = _target_class(parts)
    lineage = {cls.__name__ for cls in target.__mro__} if target is not None else None
    sites = verl_read_sites().get(parts[-1], [])
    return [s for s in sites if s.self_in_class is None or lineage is None or s.self_in_class in lineage]


# ----------------------------------------------------------------------------------------- our files


def keys_set_by(path: str | Path) -> list[str]:
    """The dotted leaf keys a yaml file sets itself (hydra's ``defaults`` and ``hydra`` entries left out).

    Files start with ``# @package _global_`` or are primary configs, so their keys are global paths.
    """
    raw = OmegaConf.load(path)
    if not isinstance(raw, DictConfig):
        raise ValueError(f"{path}: a trainer config must be a mapping, got {type(raw).__name__}")
    body = OmegaConf.to_container(raw, resolve=False)
    return sorted(_leaves({k: v for k, v in body.items() if k not in HYDRA_ENTRIES}))


def _leaves(node: Mapping[str, Any], prefix: str = "") -> list[str]:
    keys = []
    for name, value in node.items():
        if isinstance(value, Mapping) and value:
            keys += _leaves(value, f"{prefix}{name}.")
        else:
            keys.append(f"{prefix}{name}")
    return keys


def _our_option_keys() -> frozenset[str]:
    from bv_blend.verl.options import ESTIMATOR_KEYS, GLUE_KEYS

    return ESTIMATOR_KEYS | GLUE_KEYS


def check_key(key: str) -> Finding | None:
    """None if verl (or bv_blend) declares and reads ``key``; else the finding that says why not."""
    parts = key.split(".")
    if tuple(parts[:2]) == OUR_NAMESPACE:
        if len(parts) == 3 and parts[2] in _our_option_keys():
            return None
        return Finding(key, "unknown", f"not a bv_blend option; known: {sorted(_our_option_keys())}")
    node, depth = _node(verl_schema(), parts)
    if depth < len(parts):
        if isinstance(node, DictConfig) and depth > 0 and len(node) == 0:
            return None  # below a free-form mapping verl declares empty: passed through as is
        parent = ".".join(parts[:depth]) or "<root>"
        near = sorted(node.keys())[:40] if isinstance(node, DictConfig) else []
        return Finding(key, "unknown", f"verl 0.9.1 declares no '{parts[depth]}' under {parent}; it has {near}")
    if not read_sites(key):
        target = _target_class(parts)
        where = f"declared on {target.__name__}" if target is not None else "declared in verl's yaml"
        return Finding(key, "unread", f"{where} but read nowhere in verl 0.9.1")
    return None


def check_file(path: str | Path) -> list[Finding]:
    """Findings for every key the yaml file sets (empty: verl declares and reads them all)."""
    return [finding for key in keys_set_by(path) if (finding := check_key(key)) is not None]


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m tests._verl_schema CONFIG.yaml [...]", file=sys.stderr)
        return 2
    status = 0
    for path in argv:
        findings = check_file(path)
        for finding in findings:
            print(f"{path}: {finding}")
        status |= bool(findings)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
