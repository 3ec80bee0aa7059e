"""Build the verl command that trains one paper config, after checking everything that can be checked first.

The command is verl's own trainer, ``python -m verl.trainer.main_ppo --config-name paper/<name>`` (the config
``configs/paper/<name>.yaml``, found by bv_blend's hydra plugin), plus the paths as overrides. Multi-node runs
join a Ray cluster started beforehand (``ray start --head`` on the first node, ``ray start --address=<head>:6379``
on the others); verl's ``ray.init()`` connects to it through ``RAY_ADDRESS``.
"""

from __future__ import annotations

import os
import shlex
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

from omegaconf import DictConfig

from bv_blend.paper.configs import GROUP, compose_paper_config, hydra_config_name
from bv_blend.verl.context_budget import check_context_budget
from bv_blend.verl.overrides import override_value

TRAINER_MODULE = "verl.trainer.main_ppo"
METRICS_NAME = "metrics.jsonl"  # verl's file logger output in a run folder (a resumed run's: metrics.<k>.jsonl)


@dataclass(frozen=True)
class TrainLaunch:
    """One training run: the command, the extra environment, where its outputs go, and its composed config."""

    argv: list[str]
    env: dict[str, str]
    output_dir: Path
    config: DictConfig = field(repr=False)

    def shell(self) -> str:
        """The exact command as one shell line (environment assignments first)."""
        assignments = [f"{key}={shlex.quote(value)}" for key, value in sorted(self.env.items())]
        return " ".join([*assignments, shlex.join(self.argv)])


def _require_exists(paths: Sequence[Path], flag: str, kind: str = "file") -> list[Path]:
    if not paths:
        raise ValueError(f"{flag} needs at least one path.")
    resolved = []
    for path in paths:
        path = Path(path).expanduser().resolve()
        ok = path.is_dir() if kind == "directory" else path.exists()
        if not ok:
            raise FileNotFoundError(f"{flag}: {path} does not exist (or is not a {kind}); fix the path.")
        resolved.append(path)
    return resolved


def metrics_files(out: Path) -> list[Path]:
    """The metrics files earlier launches wrote into ``out``, in launch order: ``metrics.jsonl``, then a resumed run's
    ``metrics.1.jsonl``, ``metrics.2.jsonl``, ... (``bv_blend.paper.report.load_run`` reads them all)."""
    found: list[Path] = []
    while (path := _attempt_file(out, len(found))).is_file():
        found.append(path)
    return found


def metrics_file(out: Path) -> Path:
    """The file verl's ``file`` logger writes this launch's metrics to: the first attempt's name not yet taken, since
    the logger opens its file with "wb" and would erase an earlier attempt's."""
    return _attempt_file(out, len(metrics_files(out)))


def _attempt_file(out: Path, attempt: int) -> Path:
    return out / (METRICS_NAME if attempt == 0 else f"metrics.{attempt}.jsonl")


def build_train_launch(
    config: str,
    *,
    train_files: Sequence[Path],
    val_files: Sequence[Path],
    model: Path,
    codebook: Path | None = None,
    gpus_per_node: int = 8,
    nnodes: int = 1,
    output_dir: Path | None = None,
    ray_address: str | None = None,
    overrides: Sequence[str] = (),
    python: str = sys.executable,
) -> TrainLaunch:
    """Check the inputs, compose the config with every override, and return the command that trains it.

    Raises:
        FileNotFoundError: a data file, the model folder or the codebook does not exist.
        ValueError: bad counts, a BV-Blend run without a codebook, a multi-node run without a Ray cluster
            address, a config that does not compose (unknown name or bad override), or lengths the model's
            context cannot hold (:class:`~bv_blend.verl.context_budget.ContextBudgetError`, naming both numbers).
    """
    if gpus_per_node < 1 or nnodes < 1:
        raise ValueError(f"--gpus-per-node ({gpus_per_node}) and --nnodes ({nnodes}) must be >= 1.")
    train = _require_exists(train_files, "--train-files")
    val = _require_exists(val_files, "--val-files")
    (model_dir,) = _require_exists([model], "--model", kind="directory")
    if not (model_dir / "config.json").is_file():
        raise FileNotFoundError(f"--model: {model_dir} has no config.json; pass a local Hugging Face model folder.")
    codebook_path = _require_exists([codebook], "--codebook")[0] if codebook is not None else None

    address = ray_address or os.environ.get("RAY_ADDRESS")
    if nnodes > 1 and not address:
        raise ValueError(
            f"--nnodes {nnodes} needs a running Ray cluster: run `ray start --head --port=6379` on the first node "
            "and `ray start --address=<head-ip>:6379` on every other node, then pass --ray-address <head-ip>:6379."
        )

    out = Path(output_dir or Path("outputs") / f"{GROUP}_{config}").expanduser().resolve()
    logs = {"TENSORBOARD_DIR": str(out / "tensorboard"), "VERL_FILE_LOGGER_PATH": str(metrics_file(out))}
    launch_overrides = [
        f"data.train_files={override_value([str(path) for path in train])}",
        f"data.val_files={override_value([str(path) for path in val])}",
        f"actor_rollout_ref.model.path={override_value(str(model_dir))}",
        f"trainer.n_gpus_per_node={gpus_per_node}",
        f"trainer.nnodes={nnodes}",
        f"trainer.default_local_dir={override_value(str(out / 'checkpoints'))}",
        # verl's tensorboard and file loggers run inside Ray actors: hand them the log paths through Ray.
        *(f"+ray_kwargs.ray_init.runtime_env.env_vars.{key}={override_value(value)}" for key, value in logs.items()),
    ]
    if codebook_path is not None:
        launch_overrides.append(f"algorithm.bv_blend.codebook_path={override_value(str(codebook_path))}")
    all_overrides = [*launch_overrides, *overrides]  # the user's own overrides come last and win

    composed = compose_paper_config(config, all_overrides)
    if composed.algorithm.adv_estimator == "bv_blend" and not composed.algorithm.bv_blend.codebook_path:
        raise ValueError(
            f"Config {config!r} trains BV-Blend, which needs the prompt clusters' codebook: pass --codebook "
            "(written by `bv-blend codebook`)."
        )
    # verl would cap every response at the model's context without a word: refuse that here, before Ray starts.
    check_context_budget(composed, model_dir)

    argv = [python, "-m", TRAINER_MODULE, "--config-name", hydra_config_name(config), *all_overrides]
    env = dict(logs)
    if address:
        env["RAY_ADDRESS"] = address
    return TrainLaunch(argv=argv, env=env, output_dir=out, config=composed)
