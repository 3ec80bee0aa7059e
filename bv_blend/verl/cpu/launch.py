"""Launch verl's stock trainer on CPU: ``python -m bv_blend.verl.cpu.launch [hydra overrides...]``.

Composes ``--config-name bv_blend`` (verl's ppo_trainer + BV-Blend options), adds the CPU overrides of
``configs/cpu_tiny.yaml`` as ``++key=value`` arguments, then the caller's overrides (which win), and runs
``python -m verl.trainer.main_ppo`` with the environment of :func:`bv_blend.verl.cpu.cpu_env`. The trainer runs in
its own session; whatever it leaves behind (Ray's raylet, GCS, workers, vLLM engine cores) is killed on exit, so a
crashed or interrupted run never leaves Ray running.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
import uuid
from importlib import resources
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from bv_blend.machine import describe_cpu
from bv_blend.verl.cpu import cpu_env

DEFAULT_CPU_CONFIG = "cpu_tiny"
RUN_ID_ENV = "BV_BLEND_CPU_RUN_ID"


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


def processes_of_run(run_id: str) -> list[int]:
    """Pids of every live process that inherited this run's marker, wherever it moved (Ray daemons call setsid)."""
    marker = f"{RUN_ID_ENV}={run_id}".encode()
    pids = []
    for proc in Path("/proc").glob("[0-9]*"):
        try:
            if marker in (proc / "environ").read_bytes().split(b"\0"):
                pids.append(int(proc.name))
        except OSError:  # gone, or not ours to read
            continue
    return [pid for pid in pids if pid != os.getpid()]


def _stop_run(pgid: int, run_id: str) -> None:
    """SIGTERM, then SIGKILL, the trainer's session and every process that carries the run's marker."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pgid, sig)
        for pid in processes_of_run(run_id):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, sig)
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and processes_of_run(run_id):
            time.sleep(0.2)
        if not processes_of_run(run_id):
            return


def run_trainer(
    overrides: list[str],
    log_path: Path | None = None,
    metrics_path: Path | None = None,
    extra_env: dict[str, str] | None = None,
    timeout_s: float | None = None,
    cpu_config: str = DEFAULT_CPU_CONFIG,
    run_id: str | None = None,
) -> int:
    """Runs the stock trainer on CPU to completion; returns its exit code (124 on timeout).

    Every process the run started (Ray's GCS and raylet, its workers, vLLM's engine and workers) is stopped before
    this returns, whether the trainer finished, failed or timed out.

    ``log_path`` receives stdout and stderr (else they pass through); ``metrics_path`` is where verl's "file"
    logger writes one JSON line per step (VERL_FILE_LOGGER_PATH). ``extra_env`` adds variables; modules it names in
    ``VERL_USE_EXTERNAL_MODULES`` are imported next to the CPU platform. ``run_id`` marks every process of the run
    (see :func:`processes_of_run`); a fresh one is drawn when omitted.
    """
    env = cpu_env({**os.environ, **(extra_env or {})})
    run_id = run_id or uuid.uuid4().hex
    env[RUN_ID_ENV] = run_id  # inherited by Ray, its workers and vLLM: how the clean-up finds them all
    if metrics_path is not None:
        metrics_path.parent.mkdir(parents=True, exist_ok=True)
        env["VERL_FILE_LOGGER_PATH"] = str(metrics_path)
    command = trainer_command(overrides, cpu_config)
    out = open(log_path, "w") if log_path is not None else None  # noqa: SIM115 - closed in finally
    # First line of every CPU run's log: a failure report then says which kind of CPU it came from.
    header = f"[bv_blend.verl.cpu] {describe_cpu()}\n"
    if out is not None:
        out.write(header)
        out.flush()
    else:
        sys.stdout.write(header)
    process = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT if out else None,
                               start_new_session=True)
    try:
        return process.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        return 124
    finally:
        _stop_run(process.pid, run_id)
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
