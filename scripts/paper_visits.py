"""What each shipped paper config reduces to at its own scale: visits per prompt and the share of rows whose prompt
has a history, from the config's batch, rollouts and steps and the dataset's size (the start-time advisor's
arithmetic, bv_blend.history.visits; issue 29 point 5).

    python scripts/paper_visits.py                      # OpenR1-Math's 45,000 prompts, every config of configs/paper/
    python scripts/paper_visits.py --prompts 7500 spo   # another dataset size, some configs
"""

from __future__ import annotations

import argparse
import sys

from omegaconf import OmegaConf

from bv_blend.paper.configs import GROUP, compose_paper_config, config_dir, paper_config_names
from bv_blend.verl.advisor import PRIOR_OPTIONS, advise

OPENR1_PROMPTS = 45_000  # OpenR1-Math's default split, the paper's training set (docs/paper_recipe.md)


def reduces_to(config, advice) -> str:
    """What the history of this run acts as, where no row sees its prompt's history."""
    estimator = str(config.algorithm.adv_estimator)
    if advice is None:
        return "no history"
    if not advice.acts_per_prompt:
        return "the cluster level (the codebook), as configured"
    if advice.visits.history_row_share >= 1:
        return "a per-prompt history on every row, from the priors"
    if advice.visits.history_row_share > 0:
        return "a per-prompt history on a share of the rows"
    if estimator == "spo":
        return "REINFORCE++ (batch-whitened reward) until a prompt returns"
    return "the cluster level: the prompt level never has a history"


def compose(name: str):
    """The config as a run of it composes: a priors file that the config's own file requires (``???``, given at
    launch) is given a placeholder, since only whether there is one counts here."""
    own = OmegaConf.load(config_dir() / GROUP / f"{name}.yaml").get("algorithm") or {}
    required = []
    for section in ("bv_blend", "spo"):
        keys = list(own[section].keys()) if section in own else []  # `in` on the node skips a missing value
        required += [f"algorithm.{section}.{option}=PRIORS" for option in PRIOR_OPTIONS
                     if option in keys and OmegaConf.is_missing(own[section], option)]  # fmt: skip
    return compose_paper_config(name, required)


def row(name: str, prompts: int) -> list[str]:
    config = compose(name)
    advice = advise(config, prompts)
    batch, n = int(config.data.train_batch_size), int(config.actor_rollout_ref.rollout.n)
    steps = config.trainer.total_training_steps
    visits = "" if advice is None else f"{advice.visits.visits_per_prompt:.2f}"
    share = "" if advice is None else f"{advice.visits.history_row_share:.2f}"
    level = advice.level if advice is not None else ""
    return [f"`paper/{name}`", f"{config.algorithm.adv_estimator} {level}".strip(), f"{batch} x {n}", str(steps),
            visits, share, reduces_to(config, advice)]  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("configs", nargs="*", help="paper config names (default: every one in configs/paper/)")
    parser.add_argument("--prompts", type=int, default=OPENR1_PROMPTS, help="training prompts (default 45,000)")
    args = parser.parse_args(argv)
    if args.prompts < 1:
        parser.error(f"--prompts {args.prompts} must be >= 1")
    header = ["config", "estimator", "prompts x rollouts", "steps", "visits per prompt",
              "rows with a prompt history", "at this scale it is"]  # fmt: skip
    print("| " + " | ".join(header) + " |")
    print("|" + "---|" * len(header))
    for name in args.configs or paper_config_names():
        print("| " + " | ".join(row(name, args.prompts)) + " |")
    print(f"\n{args.prompts} training prompts; visits and shares only for estimators with a per-prompt history.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
