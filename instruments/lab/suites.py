"""The lab's suites: which experiments ``scripts/lab.py --suite quick|full`` runs.

The base setting is fixed from first principles, before any estimator was compared (results/lab.md, "Environment"):
16 topic clusters of 64 prompts, difficulty in logits N(1.5, 2.5^2) with half its variance between clusters,
16 prompts x 8 rollouts a step, Adam with verl's gradient clip 1.0. The learning rates put the oracle (the true
advantage R - p) halfway from its initial success to 1 after about 250 steps, under each optimizer.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace

from instruments.lab.budget import budget_experiment
from instruments.lab.env import EnvConfig
from instruments.lab.estimators import ESTIMATORS, EstimatorSpec
from instruments.lab.experiments import Arm, Experiment
from instruments.lab.optim import OptimizerConfig
from instruments.lab.run import RunSpec

BASE_ENV = EnvConfig()
ADAM = OptimizerConfig("adam", lr=0.005, clip_grad_norm=1.0)
SGD = OptimizerConfig("sgd", lr=0.25, clip_grad_norm=None)
ROLLOUT_BUDGET = BASE_ENV.rollouts_per_step  # rollouts per step, kept fixed across group sizes
REFERENCE = "grpo"

MAIN = (
    "grpo",
    "drgrpo",
    "rloo",
    "reinforce_pp",
    "bv_sem",
    "bv_fixed",
    "bv_neff",
    "bv_sigma",
    "bv_sem_literal",
    "bv_fixed_literal",
    "bv_neff_literal",
    "bv_sigma_literal",
    "bv_sem_floor_only",
    "bv_sem_clip_only",
    "bv_sem_clip5",
    "bv_bounded",
    "ha_dw",
    "maxnorm_ac",
    "oracle",
)


@dataclass(frozen=True)
class Suite:
    name: str
    steps: int
    seeds: int
    pilot_steps: int
    experiments: tuple[Experiment, ...]


def arms(
    estimators: Sequence[EstimatorSpec],
    steps: int,
    env: EnvConfig = BASE_ENV,
    optimizer: OptimizerConfig = ADAM,
    codebook: str = "true",
    tag: str = "",
    match: Sequence[str] | None = None,
) -> tuple[Arm, ...]:
    """One arm per estimator at one setting; the first estimator is the reference of the others.

    ``match``: the labels of the estimators to run step-size matched as well (all when None).
    """
    suffix = f" [{tag}]" if tag else ""
    reference = estimators[0].label + suffix
    return tuple(
        Arm(
            label=spec.label + suffix,
            spec=RunSpec(spec, env=env, optimizer=optimizer, codebook=codebook, steps=steps),
            reference=None if index == 0 else reference,
            sweep=tag,
            match=match is None or spec.label in match,
        )
        for index, spec in enumerate(estimators)
    )


def _table(*keys: str) -> list[EstimatorSpec]:
    return [ESTIMATORS[key] for key in keys]


def _labels(*keys: str) -> tuple[str, ...]:
    return tuple(ESTIMATORS[key].label for key in keys)


def group_size_env(group_size: int) -> EnvConfig:
    return replace(BASE_ENV, group_size=group_size, prompts_per_step=ROLLOUT_BUDGET // group_size)


# The estimators of the main experiment that also run step-size matched (the stability variants do not: their
# step sizes are the method's own).
MAIN_MATCHED = (
    "grpo",
    "drgrpo",
    "rloo",
    "reinforce_pp",
    "bv_sem",
    "bv_fixed",
    "bv_neff",
    "bv_sigma",
    "bv_sem_literal",
    "ha_dw",
    "maxnorm_ac",
    "oracle",
)
ABLATION = (
    "grpo",
    "bv_fixed",
    "bv_neff",
    "bv_sigma",
    "bv_sem",
    "bv_fixed_literal",
    "bv_neff_literal",
    "bv_sigma_literal",
    "bv_sem_literal",
)


def main_experiment(steps: int, match: Sequence[str] = MAIN_MATCHED) -> Experiment:
    """Every estimator of the table at the base setting, raw and step-size matched."""
    title = "All estimators, base setting (Adam, clip 1.0)"
    return Experiment("main", title, arms(_table(*MAIN), steps, match=_labels(*match)), matched=True)


def ablation_experiment(steps: int, size: int) -> Experiment:
    """The paper's weight-mode ablation at a group size where BV-Blend's history matters."""
    arm_list = arms(_table(*ABLATION), steps, env=group_size_env(size), tag=f"G={size}")
    return Experiment("ablation", f"BV-Blend weight modes at G={size} (the paper's ablation)", arm_list)


def group_size_experiment(steps: int, keys: Sequence[str], sizes: Sequence[int], match: Sequence[str]) -> Experiment:
    arm_list: tuple[Arm, ...] = ()
    for size in sizes:
        arm_list += arms(_table(*keys), steps, env=group_size_env(size), tag=f"G={size}", match=_labels(*match))
    title = f"Group size at a fixed budget of {ROLLOUT_BUDGET} rollouts a step"
    return Experiment("group_size", title, arm_list, matched=bool(match))


def codebook_experiment(steps: int, schemes: Sequence[str], sizes: Sequence[int], key: str = "codebook") -> Experiment:
    bv_sem = ESTIMATORS["bv_sem"]
    arm_list: tuple[Arm, ...] = ()
    for size in sizes:
        tag = f"G={size}"
        arm_list += arms(_table(REFERENCE), steps, env=group_size_env(size), tag=tag)
        for scheme in schemes:
            spec = replace(bv_sem, label=f"BV-Blend sem, codebook {scheme}")
            arm_list += (
                Arm(
                    f"{spec.label} [{tag}]",
                    RunSpec(spec, env=group_size_env(size), optimizer=ADAM, codebook=scheme, steps=steps),
                    reference=f"{ESTIMATORS[REFERENCE].label} [{tag}]",
                    sweep=tag,
                ),
            )
    title = "Clusters: the codebook K and how well it matches the true difficulty"
    return Experiment(key, f"{title} ({', '.join(f'G={size}' for size in sizes)})", arm_list)


def option_experiment(key: str, option: str, values: Sequence[float], steps: int, sizes: Sequence[int]) -> Experiment:
    """BV-Blend sem with one option swept (the others at their defaults), at each group size."""
    bv_sem = ESTIMATORS["bv_sem"]
    variants = [bv_sem.with_bv_blend(f"BV-Blend sem, {option}={value}", **{option: value}) for value in values]
    arm_list: tuple[Arm, ...] = ()
    for size in sizes:
        arm_list += arms([ESTIMATORS[REFERENCE], *variants], steps, env=group_size_env(size), tag=f"G={size}")
    return Experiment(key, f"BV-Blend option {option}", arm_list)


def scenario_experiment(steps: int, keys: Sequence[str]) -> Experiment:
    scenarios = {
        "hard, mu=3": replace(BASE_ENV, difficulty_mean=3.0),
        "rho=0: clusters explain nothing": replace(BASE_ENV, cluster_share=0.0),
        "rho=0.9: clusters explain most": replace(BASE_ENV, cluster_share=0.9),
        "drifting difficulty, 0.05/step": replace(BASE_ENV, drift_std=0.05),
        "nu=0: no reward-free score": replace(BASE_ENV, style_scale=0.0),
    }
    arm_list: tuple[Arm, ...] = ()
    for tag, env in scenarios.items():
        arm_list += arms(_table(*keys), steps, env=env, tag=tag)
    return Experiment("scenarios", "Environment settings: hardness, cluster share, drift, score noise", arm_list)


def sgd_experiment(steps: int, keys: Sequence[str]) -> Experiment:
    title = "Plain SGD (no clip), raw and step-size matched"
    return Experiment("sgd", title, arms(_table(*keys), steps, optimizer=SGD), matched=True)


def quick() -> Suite:
    steps = 100
    experiments = [
        budget_experiment(steps, (1, 2, 8), group_size_env,
                          methods=(("grpo", ""), ("bv_prompt_cluster", ""), ("spo", ""), ("spo", "history"),
                                   ("oracle", ""), ("grpo", "oracle"))),  # fmt: skip
        main_experiment(steps, match=("grpo", "bv_sem", "bv_fixed", "oracle")),
        group_size_experiment(steps, ("grpo", "bv_sem"), (1, 2, 4, 8, 16), match=()),
        codebook_experiment(steps, ("true", "global", "random"), sizes=(2,)),
    ]
    return Suite("quick", steps, seeds=10, pilot_steps=30, experiments=tuple(experiments))


def full() -> Suite:
    steps = 250
    experiments = [
        main_experiment(steps),
        budget_experiment(steps, (1, 2, 4, 8, 16), group_size_env),
        ablation_experiment(steps, size=2),
        group_size_experiment(
            steps,
            ("grpo", "bv_sem", "bv_sem_literal", "oracle"),
            (1, 2, 4, 8, 16),
            match=("bv_sem", "bv_sem_literal", "oracle"),
        ),
        codebook_experiment(steps, ("true", "global", "coarse", "fine", "random", "noisy"), sizes=(2,)),
        codebook_experiment(steps, ("true", "global", "random"), sizes=(8,), key="codebook_g8"),
        option_experiment("temperature", "temperature", (0.03, 0.1, 0.3, 1.0), steps, sizes=(8, 2)),
        option_experiment("gamma", "gamma", (0.5, 0.9, 0.99), steps, sizes=(2,)),
        scenario_experiment(steps, ("grpo", "bv_sem", "oracle")),
        sgd_experiment(steps, ("grpo", "drgrpo", "rloo", "reinforce_pp", "bv_sem", "bv_fixed", "oracle")),
    ]
    return Suite("full", steps, seeds=10, pilot_steps=40, experiments=tuple(experiments))


SUITES = {"quick": quick, "full": full}
