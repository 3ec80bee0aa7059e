"""The process-wide estimators of one verl trainer process, one cache for all of them.

verl computes advantages once per step, in the single-controller process (``TaskRunnerV1`` or the legacy
``TaskRunner``), and calls the registered estimator with tensors, uids and ``config.algorithm`` only. Each of our
estimators keeps its object here: it holds the history that must survive from step to step (and that the checkpoint
hooks save and the prompt sampler reads). The trainer's is built at its start (:func:`start_run`), its options parsed
once for the run; outside a trainer (the labs, tests) an estimator is built on first use from the config it is given.
What one step needs beyond that travels in its channel (``bv_blend/verl/channel.py``).

It is one holder, :data:`RUN`: the estimators, the trainer's config, the history sampler, the start-time advice, and
the errors of hooks that could not be installed (raised at trainer start rather than lost in a log).
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, NamedTuple

from bv_blend.verl.channel import StepChannel, close_all, current_step, report_group_details, report_metrics
from bv_blend.verl.records import BY_NAME

logger = logging.getLogger(__name__)


class Process(NamedTuple):
    """One estimator of this process and the options it was built from."""

    options: Any  # the record's GlueOptions
    estimator: Any  # what options.build() made
    # The trainer's ``config.algorithm`` node whose options trainer start parsed for it (``start_run``): verl passes
    # this node to every step, which then takes the process as is. ``None``: built on first use outside a trainer.
    algorithm: Any = None


@dataclass
class Run:
    """Everything this process holds across the steps of its training run."""

    # record name -> its estimator: the trainer's, built at its start, or built on first use outside a trainer
    processes: dict[str, Process] = field(default_factory=dict)
    config: Any = None  # the trainer's full config, set at trainer start (the prompt sampler reads its estimator's)
    sampler: Any = None  # the history sampler that draws the training batches, if one does
    advised: Any = None  # the trainer config the start-time advisor has read (bv_blend/verl/advisor.py) ...
    advice: Any = None  # ... and its advice (None: nothing to advise for that run)
    hook_errors: list[str] = field(default_factory=list)  # hooks that could not be installed, raised at trainer start


RUN = Run()


def start_run(config: Any, name: str | None = None) -> Process | None:
    """Trainer start: build the estimator ``name`` the trainer's config selects (``None``: none of ours), its options
    parsed here once for the run, and hold the trainer's full config (the prompt sampler reads its estimator's).

    Every later call with the trainer's ``config.algorithm`` node (each step's, the checkpoint hooks', the sampler's)
    takes this process without reading the options again, so the trainer's options are those of its start.
    """
    process = None
    if name is not None:
        algorithm = config.algorithm
        process = process_for(name, algorithm)  # bad options, a missing codebook fail here
        if process.algorithm is not algorithm:
            process = RUN.processes[name] = process._replace(algorithm=algorithm)
    RUN.config = config
    return process


def run_config() -> Any:
    if RUN.config is None:
        raise RuntimeError(
            "The history sampler drew a batch before a verl trainer started in this process: it reads the run's "
            "estimator, which the trainer's start-up builds (bv_blend's __init__ hook). Build the trainer first."
        )
    return RUN.config


def sampler_metrics(process: Process) -> dict[str, float]:
    """The metrics of the batch the history sampler drew for this step, after ``process`` folded the step (empty
    without a sampler)."""
    if RUN.sampler is None:
        return {}
    return RUN.sampler.step_metrics(getattr(process.estimator, "num_updates", 0))


def process_for(name: str, algorithm_config: Any) -> Process:
    """The process's estimator ``name`` for these options: the trainer's, the one held, or a new one.

    With the trainer's own ``config.algorithm`` node (what verl passes to every step), it is the process trainer start
    built (:func:`start_run`), and the options are not read again. Any other config (the labs, tests that call verl's
    ``compute_advantage`` directly, a notebook) is read and validated: the held estimator serves it when its options
    are equal, and the first use builds one (which loads what it needs, such as a codebook). If the options changed,
    a new estimator with a fresh history replaces the old one, with a warning.
    """
    held = RUN.processes.get(name)
    if held is not None and held.algorithm is not None and held.algorithm is algorithm_config:
        return held  # the trainer's options, parsed once at its start
    options = BY_NAME[name].options_class().from_algorithm(algorithm_config)
    if held is not None and held.options == options:
        return held
    if held is not None and getattr(held.estimator, "num_updates", 0) > 0:
        logger.warning("algorithm.%s changed within one process: its history starts afresh.", BY_NAME[name].section)
    RUN.processes[name] = Process(options, options.build())
    return RUN.processes[name]


def estimator_for(name: str, algorithm_config: Any) -> Any:
    """The process's estimator object ``name`` for these options (see :func:`process_for`)."""
    return process_for(name, algorithm_config).estimator


def held(name: str) -> Process | None:
    """The estimator ``name`` of this process, if one was built (the prompt sampler reads its history)."""
    return RUN.processes.get(name)


def reset(name: str | None = None) -> None:
    """Forget the estimator ``name`` (every estimator, the run and its sampler when ``None``) and any open channel
    (for tests and the lab)."""
    if name is None:
        RUN.processes.clear()
        RUN.config = RUN.sampler = RUN.advised = RUN.advice = None
    else:
        RUN.processes.pop(name, None)
    close_all()


ADVANTAGE_ARGS = """

    Args:
        token_level_rewards: (bs, response_length) rewards; the sequence reward is their sum.
        response_mask: (bs, response_length); all-zero rows (verl's padding) get advantage 0 and no update.
        index: (bs,) prompt uids (the groups; uids starting with "pad" are padding). What the estimator needs per uid
            (cluster ids, prompt keys) comes from the step's channel that the trainer hooks open.
        config: verl's ``config.algorithm``; the options are read from the estimator's section.

    Returns:
        advantages and returns, both (bs, response_length) (equal, as for GRPO).
    """


def advantage_function(name: str, module: str, summary: str) -> Callable[..., tuple[Any, Any]]:
    """The function verl calls for estimator ``name`` (shaped like its neighbours in ``core_algos.py``), named
    ``compute_<name>_advantage`` in ``module``: the process's estimator computes the call through its options
    (``GlueOptions.advantages``) with this step's channel, and reports its metrics into the channel."""

    def compute(token_level_rewards: Any, response_mask: Any, index: Any = None, config: Any = None,
                **kwargs: Any) -> tuple[Any, Any]:  # fmt: skip
        process = process_for(name, config)
        step = current_step() or StepChannel()
        result = process.options.advantages(process.estimator, token_level_rewards, response_mask, index, step)
        report_metrics(process.options.metrics(process.estimator))
        report_group_details(process.options.group_details(process.estimator))
        return result

    compute.__name__ = compute.__qualname__ = f"compute_{name}_advantage"
    compute.__module__, compute.__doc__ = module, summary + ADVANTAGE_ARGS
    return compute


def report_hook_error(message: str) -> None:
    """A hook could not be installed: log it loudly; the trainer-start check raises it if one of ours is used."""
    RUN.hook_errors.append(message)
    logger.error(message)


def raise_hook_errors() -> None:
    if RUN.hook_errors:
        raise RuntimeError(
            "bv_blend could not hook into this verl version, so its estimators and losses cannot run:\n- "
            + "\n- ".join(RUN.hook_errors)
        )


__all__ = [
    "RUN",
    "Process",
    "Run",
    "advantage_function",
    "estimator_for",
    "held",
    "process_for",
    "raise_hook_errors",
    "reset",
]
