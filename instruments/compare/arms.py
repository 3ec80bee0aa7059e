"""The comparison's arms: what each runs (:data:`ARMS`: a verl estimator and its hydra overrides on top of a run's,
instruments/run/verl_run.py), and a comparison's grid of runs (:class:`RunSpec`: an arm at a group size and a seed).

An arm is declared once, in :data:`ARMS`, and run at a group size n (``grpo:8``). Every arm of a comparison gets the
same rollout budget per step (``rollouts_per_step`` = prompts x n), so a smaller group sees more prompts.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path


@dataclass(frozen=True)
class Arm:
    """What one arm runs: a verl estimator (``algorithm.adv_estimator``) and hydra overrides on top of the demo's."""

    estimator: str
    overrides: tuple[str, ...] = ()
    about: str = ""

    @property
    def samples_by_history(self) -> bool:
        return SAMPLER_ON in self.overrides

    @property
    def reads_priors(self) -> bool:
        return any(PRIORS_FILE in o for o in self.overrides)


# Where an arm reads the offline priors (docs/priors.md): the comparison's own file, made once in its shared
# preparation (instruments.compare.no_revisit.prepare_priors). The arm's stored definition names the file by this
# placeholder, replaced by the path only when the run starts (:func:`run_overrides`), so that what the arm runs
# does not depend on where the comparison's folder is.
PRIORS_FILE = "PREPARED_PRIORS_FILE"
# cpu_tiny declares no spo section (SPO runs on its defaults): "++" adds the option, or sets it where declared
SPO_PRIORS = (f"++algorithm.spo.offline_values={PRIORS_FILE}",)
BV_PRIORS = (f"algorithm.bv_blend.prior_file={PRIORS_FILE}",)

# the history-driven prompt sampler and what it needs (bv_blend/verl/sampler.py refuses a run without them)
SAMPLER_ON = "data.history_sampler.enable=true"
SAMPLER = (SAMPLER_ON, "data.shuffle=true", "data.dataloader_num_workers=0")
PROMPT_LEVEL = ("algorithm.bv_blend.history_level=prompt_and_cluster",)

# Every arm a comparison can run, by name. What an arm runs is stored in each of its results and compared on
# resume, so changing an entry refuses the results made with the old one: give a changed arm a new name.
ARMS: dict[str, Arm] = {
    "grpo": Arm("grpo", (), "GRPO: the group mean as baseline"),
    "bv_blend": Arm("bv_blend", (), "BV-Blend, the cluster's history (the paper)"),
    "bv_blend_prompt": Arm("bv_blend", PROMPT_LEVEL, "BV-Blend, the prompt's history blended over its cluster's"),
    "bv_blend_sampler": Arm("bv_blend", SAMPLER, "BV-Blend (cluster history), prompts drawn by the history"),
    "bv_blend_prompt_sampler": Arm("bv_blend", PROMPT_LEVEL + SAMPLER,
                                   "BV-Blend at the prompt level, prompts drawn by the history"),
    # the cold start's lever (results/fair_verdict.md, section 3): the clusters' history chooses which prompts of
    # the pool are used, none twice in an epoch (history_spec 5)
    "bv_blend_sampler_epoch": Arm("bv_blend", (*SAMPLER, "data.history_sampler.epoch_without_replacement=true"),
                                  "BV-Blend (cluster history), each batch drawn by the history from the prompts not "
                                  "yet drawn"),
    "spo": Arm("spo", (), "SPO: each prompt's Beta tracker as baseline, normalised over the batch"),
    "spo_sampler": Arm("spo", SAMPLER, "SPO, prompts drawn by its tracker (sqrt(p(1-p)) + 0.05)"),
    # verl's own, no history: the rewards whitened over the batch, so at n = 1 the batch mean is the baseline (the
    # token lab's best arm; the NTF paper runs it this way)
    "reinforce_plus_plus": Arm("reinforce_plus_plus", (), "REINFORCE++ (verl's): the batch mean as baseline"),
    # the no-revisit regime's arms with offline priors (results/regime.md, addendum): the only history they can have
    "spo_priors": Arm("spo", SPO_PRIORS, "SPO, each prompt's tracker started from the offline priors"),
    "bv_blend_prompt_priors": Arm("bv_blend", PROMPT_LEVEL + BV_PRIORS,
                                  "BV-Blend at the prompt level, its prompts and clusters started from the offline "
                                  "priors"),
    # verl's own answer to zero-variance groups (DAPO's dynamic sampling, in core): all-equal groups are dropped and
    # more prompts generated until the batch is full; every generated rollout counts in its budget
    "grpo_dynamic": Arm("grpo", ("algorithm.filter_groups.enable=true",),
                        "GRPO with DAPO's dynamic sampling (verl's algorithm.filter_groups)"),
    # the seeds' companions (docs/companions.md), on their defaults
    "ha_dw": Arm("ha_dw", (), "HA-DW: GRPO reweighted by the history-anchored difficulty"),
    "maxnorm_rloo": Arm("maxnorm_ac", ("++algorithm.maxnorm.numerator=rloo",),
                        "MaxNorm-AC with the RLOO numerator (its paper's main instance)"),
    "reinforce_plus_plus_ntf": Arm("reinforce_plus_plus", (
        "actor_rollout_ref.actor.policy_loss._target_=bv_blend.verl.glue.ntf.NTFPolicyLossConfig",
        "actor_rollout_ref.actor.policy_loss.loss_mode=ntf"),
        "REINFORCE++ with negative token filtering (its paper's setting: one rollout a prompt)"),
}


@dataclass(frozen=True)
class RunSpec:
    """One verl run of the comparison: an arm at a group size and a seed."""

    arm: str
    n: int  # group size (rollouts per prompt)
    batch: int  # prompts per step
    seed: int
    estimator: str
    overrides: tuple[str, ...] = ()

    @property
    def name(self) -> str:
        return f"{self.arm}_n{self.n}_seed{self.seed}"

    @property
    def label(self) -> str:
        return arm_label(self.arm, self.n, self.batch)

    @property
    def definition(self) -> Arm:
        """What this run runs, as an arm: the questions about an arm's overrides are answered once, there."""
        return Arm(self.estimator, self.overrides)

    @property
    def samples_by_history(self) -> bool:
        return self.definition.samples_by_history

    @property
    def reads_priors(self) -> bool:
        return self.definition.reads_priors

    def describe(self) -> dict:
        """What decides this run's result, as stored in its result.json (JSON has no tuples)."""
        return {**asdict(self), "overrides": list(self.overrides)}


def run_overrides(spec: RunSpec, priors: Path | None) -> tuple[str, ...]:
    """The arm's overrides as the run passes them: the priors placeholder replaced by the preparation's file."""
    if not spec.reads_priors:
        return spec.overrides
    if priors is None:
        raise ValueError(f"{spec.name} reads the offline priors, and the preparation has none: make them first "
                         "(compare/no_revisit.py, prepare_priors; scripts/compare_cpu.py runs it for such arms)")
    return tuple(o.replace(PRIORS_FILE, str(priors)) for o in spec.overrides)


def arm_label(arm: str, n: int, batch: int) -> str:
    return f"{arm} n={n} ({batch} prompts)"


def parse_arm(text: str) -> tuple[str, int]:
    """``"grpo:8"`` -> ``("grpo", 8)``; raises ValueError with the arms there are."""
    name, sep, n = text.partition(":")
    if not sep or not n.strip().isdigit():
        raise ValueError(f"{text!r} is not ARM:N (an arm and its group size, e.g. grpo:8)")
    if name not in ARMS:
        raise ValueError(f"unknown arm {name!r}; the arms are {', '.join(ARMS)} (instruments/compare/arms.py, ARMS)")
    return name, int(n)


def grid(arms: Sequence[tuple[str, int]], rollouts_per_step: int, seeds: Sequence[int]) -> list[RunSpec]:
    """Every (seed, arm), seeds outermost: an interrupted comparison has whole seeds done first."""
    for name, n in arms:
        if name not in ARMS:
            raise ValueError(f"unknown arm {name!r}; the arms are {', '.join(ARMS)}")
        if n < 1 or rollouts_per_step % n:
            raise ValueError(f"group size {n} of {name} must be >= 1 and divide --rollouts-per-step "
                             f"{rollouts_per_step}, so that every arm gets the same number of rollouts per step")
    if len(set(seeds)) != len(seeds) or len(set(arms)) != len(arms):
        raise ValueError(f"seeds {list(seeds)} and arms {[f'{a}:{n}' for a, n in arms]} must not repeat")
    return [RunSpec(name, n, rollouts_per_step // n, seed, ARMS[name].estimator, ARMS[name].overrides)
            for seed in seeds for name, n in arms]


def pool_size(specs: Sequence[RunSpec], steps: int, train_prompts: int | None) -> int:
    """Training rows every run draws from: ``train_prompts``, or steps x the largest batch (every prompt seen once by
    the arm with the most prompts a step; a per-prompt history then never sees a prompt again)."""
    largest = max(spec.batch for spec in specs)
    if train_prompts is None:
        return steps * largest
    if train_prompts < largest:
        raise ValueError(f"--train-prompts {train_prompts} is smaller than the largest batch ({largest} prompts a "
                         "step): a batch holds distinct prompts")
    return train_prompts
