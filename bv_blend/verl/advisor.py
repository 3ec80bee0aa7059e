"""The start-time advisor (issue 29): how many of a run's rows a per-prompt history will act on, from its sizes.

From the trainer's config and its training set (N = ``len(trainer.train_dataset)``; the prompts a step draws, B:
``data.train_batch_size``, or the legacy trainer's dataloader batch ``data.gen_batch_size`` where it is set;
``actor_rollout_ref.rollout.n``, ``trainer.total_training_steps`` / ``total_epochs``) it plans the run's visits
(``bv_blend.history.visits``): the expected visits per prompt V, and the share of rows whose prompt has a history when
it is visited (from an earlier visit, or from a prior: the prior file is read, and only the run's prompts it covers,
keyed as the run keys them, count). With DAPO's dynamic sampling the counts are lower bounds, and the warning says
so. Both are step metrics (``advisor/visits_per_prompt``, ``advisor/prompt_history_row_share``) of every run of an
estimator that can keep a per-prompt history (its record's ``inputs`` hold ``PROMPT_KEYS``). Where the run keeps
one (its options' ``inputs()`` hold ``PROMPT_KEYS``: SPO, BV-Blend at ``history_level=prompt`` /
``prompt_and_cluster``) and the share is below :data:`WARN_BELOW`, it logs one warning with the numbers and the
settings that would act; a prior file that covers none of the run's prompts is warned on at every level. It is
advice: nothing here raises into the run; where the advisor itself fails, one warning names the error and the run
goes on without advice.

Where it runs: the legacy trainer has its training set once ``__init__`` returns (``hooks._checked_init``); verl's V1
trainer builds it later, in ``init()``, so there the first advantage step advises (before its metrics are logged).
"""

from __future__ import annotations

import dataclasses
import logging
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from bv_blend.history.priors import load_priors
from bv_blend.history.visits import Visits, plan_visits, planned_steps
from bv_blend.verl import runtime
from bv_blend.verl.options import config_get, selected_record
from bv_blend.verl.records import PROMPT_KEYS, EstimatorRecord

logger = logging.getLogger(__name__)

# Set from issue 29's measurements (docs/history.md, "The start-time advisor"): 0.75, four visits per prompt under
# verl's sampler. Where no prompt came back (share 0) a per-prompt history acted on no row: SPO n=1's advantages were
# REINFORCE++ n=1's to float rounding (both labs; level with it) and BV-Blend's prompt level is its cluster level.
# The shares at which one acted were 0.875-0.94 (8-16 visits, the last round's token lab), and even there it did not
# beat its history-free twin. Nothing was measured between; 0.75 is the "often revisited" (four visits).
WARN_BELOW = 0.75
# The options that start a history from `bv-blend priors`' file (history_spec 4), by their name in a section.
PRIOR_OPTIONS = ("prior_file", "offline_values")
# The option that chooses whose history an estimator keeps, on its math's config (BV-Blend's history_spec 3).
LEVEL_OPTION = "history_level"
METRICS = ("advisor/visits_per_prompt", "advisor/prompt_history_row_share")


@dataclass(frozen=True)
class Advice:
    """What the advisor found for one run.

    Attributes:
        record: the run's estimator.
        acts_per_prompt: the run keeps a per-prompt history (the warning is about it only).
        visits: the planned visits (N, B, steps, V, the share of rows with a prompt history).
        group_size: n, the rollouts of each visit.
        sampler: the history sampler draws the batches (else verl's epochs).
        level: ``algorithm.<section>.history_level=...`` where the estimator has that option, else ``""``.
        fixes: the settings that would give more rows a prompt history.
        prior: ``algorithm.<section>.<option>=PATH`` where the run sets a prior file, else ``""``.
        prior_covered: how many of the run's distinct prompts the prior file holds (``None``: not counted, the
            planning script's case, which takes the file as covering every prompt).
        distinct_prompts: the run's distinct prompt keys (where counted).
        keyed_by: how the run keys its prompts (``extra_info[field]`` or the prompt text's hash).
        lower_bound: DAPO's dynamic sampling is on: refill draws more prompts than the counts hold.
    """

    record: EstimatorRecord
    acts_per_prompt: bool
    visits: Visits
    group_size: int
    sampler: bool
    level: str = ""
    fixes: tuple[str, ...] = ()
    prior: str = ""
    prior_covered: int | None = None
    distinct_prompts: int | None = None
    keyed_by: str = ""
    lower_bound: bool = False

    def metrics(self) -> dict[str, float]:
        return dict(zip(METRICS, (self.visits.visits_per_prompt, self.visits.history_row_share), strict=True))

    def warning(self) -> str | None:
        """The one warning: a prior file that covers none of the run's prompts (at every level: it gives no prompt
        and no cluster a start), or a per-prompt history that would act on under :data:`WARN_BELOW` of the rows."""
        if self.prior and self.prior_covered == 0:
            return self._uncovered_prior()
        visits = self.visits
        if not self.acts_per_prompt or visits.history_row_share >= WARN_BELOW:
            return None
        draws = ("the history sampler's independent batches (drawn as if uniform)" if self.sampler else
                 "verl's sampler: epochs without replacement, as the history sampler's epoch mode draws")  # fmt: skip
        return (
            f"bv_blend advisor: {self.record.label}{f' ({self.level})' if self.level else ''} keeps a per-prompt "
            f"history, but few rows of this run will see it: {visits.prompts} training prompts, "
            f"{visits.batch_size} prompts a step x {self.group_size} rollouts, {visits.steps} steps give "
            f"{visits.visits_per_prompt:.2f} expected visits per prompt ({draws}){self._covered()}, so a share of "
            f"{visits.history_row_share:.2f} of the rows see their prompt's history (the advisor warns below "
            f"{WARN_BELOW}). The other rows are first visits, where the prompt's history has nothing to act on. "
            f"Settings that would act: {'; or '.join(self.fixes)}.{self._bound()} What was measured where prompts "
            f"seldom come back, and what to run there: results/regime/recommendation.md. This is a warning: the run "
            f"goes on."
        )

    def _covered(self) -> str:
        if not self.prior or self.prior_covered is None:
            return ""
        return (f"; the prior file ({self.prior}) holds {self.prior_covered} of the run's {self.distinct_prompts} "
                "prompts")  # fmt: skip

    def _bound(self) -> str:
        if not self.lower_bound:
            return ""
        return (" DAPO's dynamic sampling is on (algorithm.filter_groups.enable=true): verl draws more prompts to "
                "refill the groups it filters, so these visits and this share are lower bounds.")  # fmt: skip

    def _uncovered_prior(self) -> str:
        return (
            f"bv_blend advisor: {self.record.label}'s prior file ({self.prior}) holds none of this run's "
            f"{self.distinct_prompts} training prompts, so no prompt (and no cluster) starts with a history from it. "
            f"The likely cause is a key mismatch: this run keys each prompt by {self.keyed_by}, and the file was "
            f"keyed otherwise (another prompt_key_field, or another dataset or preprocessing). Write it again with "
            f"`bv-blend priors` over this run's data.train_files and the same prompt_key_field, or unset the "
            f"option.{self._bound()} This is a warning: the run goes on."
        )


def advise(config: Any, prompts: int, keys: Sequence[str] | None = None) -> Advice | None:
    """The advice for a run of ``prompts`` training prompts and this full trainer ``config`` (no log); ``None`` for a
    run whose estimator keeps no per-prompt history, or that trains no step.

    ``keys`` are the run's prompt keys (one a training row, keyed as the run keys them): with a prior file, the share
    counts only the prompts the file holds. Without them (planning, before any dataset) the file is taken as covering
    every prompt.
    """
    record = selected_record(config)
    if record is None or PROMPT_KEYS not in record.inputs:
        return None
    from bv_blend.verl.sampler import sampler_options

    data, trainer = config_get(config, "data"), config_get(config, "trainer")
    batch_size = _prompts_a_step(config)
    total = config_get(trainer, "total_training_steps")
    steps = planned_steps(prompts, batch_size, int(config_get(trainer, "total_epochs") or 0),
                          None if total is None else int(total))  # fmt: skip
    if steps <= 0:
        return None
    options = record.options_class().from_algorithm(config_get(config, "algorithm"))
    prior = next((name for name in PRIOR_OPTIONS if hasattr(options, name)), None)
    path = getattr(options, prior) if prior is not None else None
    field = getattr(options, "prompt_key_field", None)
    covered = distinct = None
    coverage = 0.0
    if path is not None:
        coverage = 1.0
        if keys is not None:
            run_keys = set(keys)
            held = load_priors(path, f"{record.option_section}.{prior}")
            covered, distinct = len(run_keys & held.keys()), len(run_keys)
            coverage = covered / distinct if distinct else 0.0
    drawn = sampler_options(data)
    # the history sampler's epoch mode draws each prompt once an epoch, as verl's own sampler does
    sampler = drawn.enable and not drawn.epoch_without_replacement
    visits = plan_visits(prompts, batch_size, steps, sampler, coverage)
    rollout = config_get(config_get(config, "actor_rollout_ref"), "rollout")
    level, fixes = _levels(record, options)
    if prior is not None:
        fixes += (f"priors: `bv-blend priors`, then {record.option_section}.{prior}=PATH (every prompt starts with a "
                  "history; their scores cost rollouts before the run)",)  # fmt: skip
    filtered = bool(config_get(config_get(config_get(config, "algorithm"), "filter_groups"), "enable"))
    return Advice(record, PROMPT_KEYS in options.inputs(), visits, int(config_get(rollout, "n") or 1), sampler,
                  level, fixes, f"{record.option_section}.{prior}={path}" if path is not None else "", covered,
                  distinct, f"extra_info[{field!r}]" if field else "the hash of its prompt's text",
                  filtered)  # fmt: skip


def _prompts_a_step(config: Any) -> int:
    """B: the legacy trainer's steps are its dataloader's batches, ``data.gen_batch_size`` where it is set
    (``RayPPOTrainer._create_dataloader``, whose length makes the steps of an epoch); the V1 trainer's step trains
    ``train_batch_size`` prompts (``gen_batch_size`` is only how it fetches them) and counts its epochs in them."""
    data = config_get(config, "data")
    train_batch_size = int(config_get(data, "train_batch_size"))
    if config_get(config_get(config, "trainer"), "use_v1") is False:
        return int(config_get(data, "gen_batch_size") or train_batch_size)
    return train_batch_size


def _levels(record: EstimatorRecord, options: Any) -> tuple[str, tuple[str, ...]]:
    """The run's history level (where its estimator has :data:`LEVEL_OPTION`), and the other levels that read the
    cluster's history (which every row whose cluster was seen has)."""
    math = getattr(options, "config", None)
    if not dataclasses.is_dataclass(math) or not hasattr(math, LEVEL_OPTION) or not hasattr(math, "uses_clusters"):
        return "", ()
    from bv_blend.blend.config import HISTORY_LEVELS

    current = getattr(math, LEVEL_OPTION)
    spell = f"{record.option_section}.{LEVEL_OPTION}"
    others = [level for level in HISTORY_LEVELS
              if level != current and dataclasses.replace(math, **{LEVEL_OPTION: level}).uses_clusters]  # fmt: skip
    if not others:
        return f"{spell}={current}", ()
    levels = " or ".join(f"{spell}={level}" for level in others)
    return f"{spell}={current}", (f"{levels} (the cluster's history acts on every row whose cluster was seen)",)


def advise_trainer(trainer: Any) -> Advice | None:
    """The trainer hooks' entry: advise ``trainer``'s run once (the warning, if any, is logged then) and hold the
    advice in ``runtime.RUN``; ``None`` where there is none, or where the trainer has no training set yet (verl's V1
    trainer before ``init()``). Never raises: the advisor must not fail a run."""
    config = getattr(trainer, "config", None)
    if config is None or selected_record(config) is None:
        return None
    if runtime.RUN.advised is config:
        return runtime.RUN.advice
    dataset = getattr(trainer, "train_dataset", None)
    if dataset is None:
        logger.debug("bv_blend advisor: the trainer has no train_dataset yet (verl's V1 trainer builds it in init()); "
                     "its first advantage step advises.")  # fmt: skip
        return None
    try:
        advice = advise(config, len(dataset), _run_keys(config, dataset))
    except Exception as error:  # advice only: the run goes on without it, and the user is told why
        logger.warning("bv_blend advisor: could not advise this run (%s: %s); training goes on without its advice "
                       "(visits per prompt, the share of rows with a prompt history, the prior file's coverage).",
                       type(error).__name__, error)  # fmt: skip
        logger.debug("bv_blend advisor: the error's traceback.", exc_info=True)
        advice = None
    runtime.RUN.advised, runtime.RUN.advice = config, advice
    message = advice.warning() if advice is not None else None
    if message is not None:
        logger.warning(message)
    return advice


def _run_keys(config: Any, dataset: Any) -> Sequence[str] | None:
    """The run's prompt keys, only where a prior file is set (reading every row costs a pass over the dataset)."""
    record = selected_record(config)
    if record is None or PROMPT_KEYS not in record.inputs:
        return None
    options = record.options_class().from_algorithm(config_get(config, "algorithm"))
    if all(getattr(options, name, None) is None for name in PRIOR_OPTIONS):
        return None
    from bv_blend.verl.training_data import dataset_prompt_keys

    return dataset_prompt_keys(dataset, getattr(options, "prompt_key_field", None))


def step_metrics(trainer: Any = None) -> dict[str, float]:
    """The advisor's metrics for this step's channel: ``trainer``'s advice (V1, advised on its first step), or, with
    no trainer (the legacy module-level advantage step), the advice held for this process's run."""
    if trainer is not None:
        advice = advise_trainer(trainer)
    else:
        run = runtime.RUN
        advice = run.advice if run.advised is not None and run.advised is run.config else None
    return advice.metrics() if advice is not None else {}


__all__ = ["METRICS", "WARN_BELOW", "Advice", "advise", "advise_trainer", "step_metrics"]
