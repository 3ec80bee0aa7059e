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

The option sections of our estimators (``algorithm.bv_blend.*``, ``algorithm.spo.*``, ``algorithm.ha_dw.*``,
``algorithm.maxnorm.*``, one per record) and of the prompt sampler (``data.history_sampler.*``) are ours, not
verl's: each is checked against the options bv_blend reads there. So is the NTF loss's one key on verl's section,
``policy_loss.ntf_keep_ratio``, with the ``_target_`` that selects the dataclass declaring it (verl builds each
section's dataclass from its ``_target_``).
A key verl's yaml does not declare still counts as declared
when it is a field of the section's ``_target_`` dataclass (``omega_conf_to_dataclass`` accepts it). Below
:data:`PASS_THROUGH` mappings, which verl hands whole to another library, nothing can be checked.

Which keys: :func:`job_keys` composes a config by name as ``main_ppo`` does (hydra, verl's config module, our
search-path plugin) and takes every key set by one of our files in hydra's defaults list for it, plus every key
whose composed value differs from verl's own ``ppo_trainer`` (so keys that arrive through ``defaults`` or
overrides count too). :func:`keys_set_by` reads one file alone.

Run on configs by name: ``python -m tests._verl_schema paper/qwen25_math_7b bv_blend``.
"""

from __future__ import annotations

import ast
import importlib
import re
import sys
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from functools import cache, lru_cache
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

# Top-level entries of a config file that are hydra's, not the trainer's.
HYDRA_ENTRIES = frozenset({"defaults", "hydra"})
# Mappings verl passes whole to another library: ray.init(**ray_init) (trainer/main_ppo.py) and the
# TransferQueue client's own config. Their keys are that library's to read.
PASS_THROUGH = ("ray_kwargs.ray_init", "transfer_queue")
# Where hydra finds our configs (the provider name of bv_blend's search-path plugin).
OUR_PROVIDER = "bv_blend"


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


@cache
def read_sites(key: str) -> tuple[_ReadSite, ...]:
    """The places in verl that read ``key`` (see the module docstring for what counts)."""
    parts = key.split(".")
    target = _target_class(parts)
    lineage = {cls.__name__ for cls in target.__mro__} if target is not None else None
    sites = verl_read_sites().get(parts[-1], [])
    return tuple(s for s in sites if s.self_in_class is None or lineage is None or s.self_in_class in lineage)


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


@cache
def our_sections() -> dict[tuple[str, ...], frozenset[str]]:
    """Our option sections in verl's config, each with the keys bv_blend reads there."""
    from bv_blend.core.options import OptionsMixin
    from bv_blend.verl.records import RECORDS
    from bv_blend.verl.sampler import SamplerOptions

    sections = {("algorithm", record.section): frozenset(record.options_class().defaults()) for record in RECORDS}
    sampler: OptionsMixin = SamplerOptions()
    return {**sections, ("data", "history_sampler"): frozenset(sampler.to_dict())}


@cache
def our_keys_in_verl_sections() -> frozenset[str]:
    """Keys we add to verl's config: the NTF keep ratio and the ``_target_`` selecting its dataclass, and the group
    record's file (a root section of bv_blend's own)."""
    from bv_blend.verl import group_record
    from bv_blend.verl.glue import ntf as losses

    return frozenset({f"{losses.SECTION}.{losses.KEEP_RATIO_KEY}", f"{losses.SECTION}._target_", group_record.OPTION})


def _dataclass_field(parts: list[str], depth: int) -> Any | None:
    """The field ``parts[depth]`` of the ``_target_`` dataclass of the section ``parts[:depth]``, if it has one."""
    target = _target_class([*parts[:depth], parts[depth]])
    fields = getattr(target, "__dataclass_fields__", {}) if target is not None else {}
    return fields.get(parts[depth])


@cache  # configs share most keys; the schema and verl's source do not change in a run
def check_key(key: str) -> Finding | None:
    """None if verl (or bv_blend) declares and reads ``key``; else the finding that says why not."""
    parts = key.split(".")
    if (known := our_sections().get(tuple(parts[:2]))) is not None:
        if len(parts) == 3 and parts[2] in known:
            return None
        return Finding(key, "unknown", f"not a bv_blend option of {'.'.join(parts[:2])}; known: {sorted(known)}")
    if key in our_keys_in_verl_sections():
        return None
    if any(key == prefix or key.startswith(prefix + ".") for prefix in PASS_THROUGH):
        return None
    node, depth = _node(verl_schema(), parts)
    if depth < len(parts):
        if isinstance(node, DictConfig) and depth > 0 and len(node) == 0:
            return None  # below a free-form mapping verl declares empty: passed through as is
        if depth > 0 and _dataclass_field(parts, depth) is not None:
            if depth + 1 < len(parts):
                return None  # below a field verl's dataclass takes as a dict (fsdp_config.mixed_precision, say)
        else:
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


# ----------------------------------------------------------------------------------------- composed configs


def _compose(config_name: str, overrides: Iterable[str]) -> tuple[DictConfig, list[tuple[Path, str]]]:
    """The job config as main_ppo composes it, and our files in hydra's defaults list with their packages."""
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.types import RunMode

    GlobalHydra.instance().clear()
    with initialize_config_module("verl.trainer.config", version_base=None):
        loader = GlobalHydra.instance().config_loader()
        files = []
        for default in loader.compute_defaults_list(config_name, list(overrides), RunMode.RUN).defaults:
            if not default.config_path or default.config_path.startswith("hydra/"):
                continue
            loaded = loader.repository.load_config(default.config_path)
            if loaded is not None and loaded.provider == OUR_PROVIDER:
                folder = Path(loaded.path.removeprefix("file://"))
                files.append((folder / f"{default.config_path}.yaml", default.package or ""))
        job = compose(config_name=config_name, overrides=list(overrides))
    GlobalHydra.instance().clear()
    return job, files


def job_keys(config_name: str, overrides: Iterable[str] = ()) -> list[str]:
    """The keys our side sets in the job config ``config_name`` (e.g. ``paper/qwen25_math_7b``) with ``overrides``:
    those set by our files in its defaults list (even to verl's own value), and those whose composed value
    differs from verl's ``ppo_trainer`` or that verl does not have."""
    return list(_job_keys(config_name, tuple(overrides)))


@cache
def _job_keys(config_name: str, overrides: tuple[str, ...]) -> tuple[str, ...]:
    # cached: a composition costs seconds, and a test that reads the keys then checks them would compose twice
    job, files = _compose(config_name, overrides)
    ours = {f"{package}.{key}" if package else key for path, package in files for key in keys_set_by(path)}
    composed = _flat(job)
    stock = _flat(verl_schema())
    missing = object()
    changed = {key for key, value in composed.items() if stock.get(key, missing) != value}
    return tuple(sorted(ours | changed))


def _flat(config: DictConfig) -> dict[str, Any]:
    from bv_blend.verl.overrides import dotted_leaves

    return dotted_leaves(OmegaConf.to_container(config, resolve=False, throw_on_missing=False))


def check_job(config_name: str, overrides: Iterable[str] = ()) -> list[Finding]:
    """Findings for every key of :func:`job_keys` (empty: verl, or bv_blend, declares and reads them all)."""
    return [finding for key in job_keys(config_name, overrides) if (finding := check_key(key)) is not None]


def main(argv: list[str]) -> int:
    if not argv:
        print("usage: python -m tests._verl_schema CONFIG_NAME|FILE.yaml [...]", file=sys.stderr)
        return 2
    status = 0
    for name in argv:
        findings = check_file(name) if name.endswith(".yaml") else check_job(name)
        for finding in findings:
            print(f"{name}: {finding}")
        status |= bool(findings)
    return status


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
