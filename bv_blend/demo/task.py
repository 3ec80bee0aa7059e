"""A synthetic arithmetic task with a 0/1 verifier, in verl's RL parquet format.

Problem families differ in difficulty (a tiny model masters small sums quickly, products slowly) and in
wording, so a sentence encoder separates them into clusters and a warmed-up model gets a real share of
all-right and all-wrong groups: the cold-start regime BV-Blend targets. The verifier is verl's own GSM8K
rule scorer (``data_source="openai/gsm8k"``): a response scores 1 iff it contains ``#### <exact answer>``.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

DATA_SOURCE = "openai/gsm8k"  # selects verl's rule scorer verl/utils/reward_score/gsm8k.py


@dataclass(frozen=True)
class Problem:
    family: str
    question: str
    answer: int

    @property
    def target(self) -> str:
        """The response a perfect model writes (what the warm-up imitates and the verifier accepts)."""
        return f"#### {self.answer}"


def _family(name: str, templates: list[str], draw: Callable[[random.Random], tuple[int, int, int]]):
    def make(rng: random.Random) -> Problem:
        a, b, answer = draw(rng)
        return Problem(name, rng.choice(templates).format(a=a, b=b), answer)

    return make


# From easy to hard for a 2-layer model: copying, few facts to memorise, more facts, times tables, carrying sums.
FAMILIES = {
    "echo": _family(
        "echo",
        ["Repeat the number {a}.", "Write down {a}."],
        lambda r: (a := r.randint(0, 99), 0, a),
    ),
    "tiny_sum": _family(
        "tiny_sum",
        ["What is {a} + {b}?", "{a} plus {b} equals what?"],
        lambda r: (a := r.randint(0, 4), b := r.randint(0, 4), a + b),
    ),
    "small_sum": _family(
        "small_sum",
        ["Add {a} and {b}.", "Find the total of {a} and {b}."],
        lambda r: (a := r.randint(0, 9), b := r.randint(0, 9), a + b),
    ),
    "product": _family(
        "product",
        ["Multiply {a} by {b}.", "What is the product of {a} and {b}?"],
        lambda r: (a := r.randint(2, 12), b := r.randint(2, 12), a * b),
    ),
    "big_sum": _family(
        "big_sum",
        ["Compute the sum of {a} and {b}.", "How much is {a} plus {b} in total?"],
        lambda r: (a := r.randint(10, 99), b := r.randint(10, 99), a + b),
    ),
}


def make_problems(n: int, seed: int) -> list[Problem]:
    """``n`` problems drawn evenly over the families, reproducible from ``seed``."""
    rng = random.Random(seed)
    makers = list(FAMILIES.values())
    return [makers[i % len(makers)](rng) for i in range(n)]


def to_verl_frame(problems: list[Problem], split: str) -> pd.DataFrame:
    """Rows as verl's RLHFDataset reads them (chat prompt, rule reward with ground truth, extra_info)."""
    return pd.DataFrame(
        [
            {
                "data_source": DATA_SOURCE,
                "prompt": [{"role": "user", "content": p.question}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(p.answer)},
                "extra_info": {"split": split, "index": i, "question": p.question, "family": p.family},
            }
            for i, p in enumerate(problems)
        ]
    )


def write_task(out_dir: Path, n_train: int, n_val: int, seed: int) -> tuple[Path, Path]:
    """Writes train.parquet and val.parquet (disjoint seeds) under ``out_dir``."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = out_dir / "train.parquet", out_dir / "val.parquet"
    to_verl_frame(make_problems(n_train, seed), "train").to_parquet(paths[0])
    to_verl_frame(make_problems(n_val, seed + 1), "val").to_parquet(paths[1])
    return paths
