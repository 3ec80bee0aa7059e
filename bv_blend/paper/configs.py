"""The paper's hydra configs: where they live, how to compose them, how they differ.

Each paper config is a primary config, ``configs/paper/<name>.yaml``, that verl's trainer finds by name through
bv_blend's hydra plugin: ``python -m verl.trainer.main_ppo --config-name paper/<name>``. The main run inherits
the base ``configs/bv_blend.yaml`` (verl's ``ppo_trainer`` + BV-Blend) and every comparison inherits the main run.
"""

from __future__ import annotations

from collections.abc import Iterable
from importlib import resources
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf

from bv_blend.verl.overrides import dotted_leaves

BASE_CONFIG = "bv_blend"
GROUP = "paper"
MAIN_CONFIG = "qwen25_math_7b"

# Each comparison, with the dotted keys it may change relative to the main run.
# trainer.experiment_name (BOOKKEEPING_KEYS) only names the run's logs and checkpoints.
COMPARISONS: dict[str, tuple[str, frozenset[str]]] = {
    "grpo": ("GRPO, same settings", frozenset({"algorithm.adv_estimator"})),
    "fixed_w": (
        "BV-Blend, fixed w = 0.5",
        frozenset({"algorithm.bv_blend.weight_mode", "algorithm.bv_blend.fixed_weight"}),
    ),
    "neff": ("BV-Blend, N_eff-only weight", frozenset({"algorithm.bv_blend.weight_mode"})),
    "sigma": ("BV-Blend, sigma-only weight", frozenset({"algorithm.bv_blend.weight_mode"})),
    "literal": (
        "BV-Blend, the paper's literal formulas (no variance floor, no clip)",
        frozenset({"algorithm.bv_blend.variance_floor", "algorithm.bv_blend.max_abs_advantage"}),
    ),
    "qwen25_math_1p5b": ("Qwen2.5-Math-1.5B backbone", frozenset({"actor_rollout_ref.model.path"})),
    "qwen25_7b_instruct": ("Qwen2.5-7B-Instruct backbone", frozenset({"actor_rollout_ref.model.path"})),
    "llama31_8b_instruct": ("Llama-3.1-8B-Instruct backbone", frozenset({"actor_rollout_ref.model.path"})),
}
BOOKKEEPING_KEYS = frozenset({"trainer.experiment_name"})
PAPER_CONFIGS: tuple[str, ...] = (MAIN_CONFIG, *COMPARISONS)


def config_dir() -> Path:
    """The folder holding the yaml files (the installed ``bv_blend.configs`` package)."""
    return Path(str(resources.files("bv_blend.configs"))).resolve()


def paper_config_names() -> list[str]:
    """The experiment configs present in ``configs/paper/``."""
    return sorted(p.stem for p in (config_dir() / GROUP).glob("*.yaml"))


def hydra_config_name(name: str | None) -> str:
    """The ``--config-name`` of paper config ``name`` (``None``: the base config)."""
    return BASE_CONFIG if name is None else f"{GROUP}/{name}"


def compose_paper_config(name: str | None, overrides: Iterable[str] = ()) -> DictConfig:
    """Compose ``configs/paper/<name>.yaml`` (``None``: the base config) with overrides, as verl's ``main_ppo``
    does: from verl's own config module, finding ours through the search-path plugin.

    Raises:
        ValueError: ``name`` is not in ``configs/paper/`` (the message lists those there), or an override does
            not apply (hydra's message says which and how).
    """
    from hydra import compose, initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException

    if name is not None and name not in paper_config_names():
        raise ValueError(f"No paper config {name!r} in {config_dir() / GROUP}; choose one of: "
                         f"{', '.join(paper_config_names())}.")
    GlobalHydra.instance().clear()
    try:
        with initialize_config_module("verl.trainer.config", version_base=None):
            return compose(config_name=hydra_config_name(name), overrides=list(overrides))
    except HydraException as exc:  # a bad override or a broken config: say which, in one line
        raise ValueError(f"Config {name!r} does not compose with the given overrides: {exc}") from exc


def config_diff(a: DictConfig, b: DictConfig, resolve: bool = False) -> dict[str, tuple[Any, Any]]:
    """Dotted keys whose values differ between two configs, as ``{key: (value_in_a, value_in_b)}``.

    Unresolved by default, so only keys that were set differently show (an interpolation such as
    ``${trainer.experiment_name}`` compares as its text); ``resolve=True`` also shows where changes land.
    """
    flat_a = dotted_leaves(OmegaConf.to_container(a, resolve=resolve, throw_on_missing=False))
    flat_b = dotted_leaves(OmegaConf.to_container(b, resolve=resolve, throw_on_missing=False))
    missing = object()
    return {
        key: (flat_a.get(key), flat_b.get(key))
        for key in sorted(set(flat_a) | set(flat_b))
        if flat_a.get(key, missing) != flat_b.get(key, missing)
    }
