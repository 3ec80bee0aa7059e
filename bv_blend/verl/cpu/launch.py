"""Launch verl's stock trainer on CPU: ``python -m bv_blend.verl.cpu_launch [hydra overrides...]``.

Composes ``--config-name bv_blend`` (verl's ppo_trainer + BV-Blend options), adds the CPU overrides of
``configs/cpu_tiny.yaml`` as ``++key=value`` arguments, then the caller's overrides (which win), and runs
``python -m verl.trainer.main_ppo`` with the environment of :func:`bv_blend.verl.cpu.cpu_env`. The trainer runs in
its own session; whatever it leaves behind (Ray's raylet, GCS, workers, vLLM engine cores) is killed on exit, so a
crashed or interrupted run never leaves Ray running.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from importlib import resources
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from bv_blend.verl.cpu import cpu_env

DEFAULT_CPU_CONFIG = "cpu_tiny"


def configs_dir() -> Path:
    """The folder holding bv_blend.yaml and the cpu_*.yaml fragments (shipped as the package bv_blend.configs)."""
    return Path(str(resources.files("bv_blend.configs")))


def _format(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if value is None:
        return "null"
    if isinstance(value, (list, tuple, ListConfig)):
        return "[" + ",".join(_format(v) for v in value) + "]"
    text = str(value)
    # hydra's override grammar needs quotes around strings with spaces or grammar characters
    return repr(text) if any(c in text for c in " ,[]{}()='\"") else text


def _leaves(node: Any, prefix: str) -> list[tuple[str, Any]]:
    if isinstance(node, DictConfig):
        out: list[tuple[str, Any]] = []
        for key in node:
            out += _leaves(node[key], f"{prefix}.{key}" if prefix else str(key))
        return out
    return [(prefix, node)]


def cpu_overrides(name: str = DEFAULT_CPU_CONFIG) -> list[str]:
    """``configs/<name>.yaml`` as hydra ``++key=value`` overrides (add-or-replace, so undeclared keys work too)."""
    path = configs_dir() / f"{name}.yaml"
    if not path.is_file():
        available = sorted(p.stem for p in configs_dir().glob("cpu_*.yaml"))
        raise FileNotFoundError(f"no CPU config '{name}' at {path}; available: {available}")
    return [f"++{key}={_format(value)}" for key, value in _leaves(OmegaConf.load(path), "")]


def trainer_command(overrides: list[str], cpu_config: str = DEFAULT_CPU_CONFIG) -> list[str]:
    """The main_ppo command line: BV-Blend base config, CPU overrides, then ``overrides`` (last one wins)."""
    return [
        sys.executable, "-m", "verl.trainer.main_ppo",
        "--config-path", str(configs_dir()), "--config-name", "bv_blend",
        *cpu_overrides(cpu_config), *overrides,
    ]  # fmt: skip


def _kill_session(pgid: int) -> None:
    """SIGTERM, then SIGKILL, every process left in the trainer's session (Ray, vLLM)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        try:
            os.killpg(pgid, sig)
        except ProcessLookupError:
            return
        time.sleep(3)


def run_trainer(
    overrides: list[str],
    log_path: Path | None = None,
    metrics_path: Path | None = None,
    extra_env: dict[str, str] | None = None,
    timeout_s: float | None = None,
    cpu_config: str = DEFAULT_CPU_CONFIG,
) -> int:
    """Runs the stock trainer on CPU to completion; returns its exit code (124 on timeout).

    ``log_path`` receives stdout and stderr (else they pass through); ``metrics_path`` is where verl's "file"
    logger writes one JSON line per step (VERL_FILE_LOGGER_PATH).
    """
    env = cpu_env()
    if metrics_path is not None:
        metrics_path.parent.mkdir(parents=True, exist_ok=True)
        env["VERL_FILE_LOGGER_PATH"] = str(metrics_path)
    env.update(extra_env or {})
    command = trainer_command(overrides, cpu_config)
    out = open(log_path, "w") if log_path is not None else None  # noqa: SIM115 - closed in finally
    process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT if out else None,
                               start_new_session=True)
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return 124
    finally:
        _kill_session(process.pid)
        process.wait()
        if out is not None:
            out.close()


def verl_rule_score(data_source: str, response: str, ground_truth: str) -> float:
    """The reward verl's trainer gives ``response`` (its default rule scorer for ``data_source``)."""
    from verl.utils.reward_score import default_compute_score

    return float(default_compute_score(data_source, response, ground_truth))


def main(argv: list[str] | None = None) -> int:
    return run_trainer(list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    sys.exit(main())
