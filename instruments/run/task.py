"""A synthetic arithmetic task with a 0/1 verifier, in verl's RL parquet format, with a held-out split.

Problem families differ in difficulty (a tiny model masters small sums quickly, products slowly) and in
wording, so a sentence encoder separates them into clusters and a warmed-up model gets a real share of
all-right and all-wrong groups: the cold-start regime BV-Blend targets. The verifier is verl's own GSM8K
rule scorer: a response scores 1 iff it contains ``#### <exact answer>``.

The validation split is held out by prompt: each family's whole problem space (every wording x operand pair) is
enumerated and shuffled, the first few go to validation, and nothing else (RL training prompts, the supervised
warm-up, the tokenizer's corpus) is ever drawn from them. The small families have few distinct prompts
(sums of 0-4: 50), so a held-out prompt may share its arithmetic fact with a training prompt in the other wording;
what is held out is the prompt, as in any RL validation split.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Collection
from dataclasses import dataclass
from pathlib import Path

import pandas as pd

GSM8K_SOURCE = "openai/gsm8k"  # selects verl's rule scorer verl/utils/reward_score/gsm8k.py
DATA_SOURCE = GSM8K_SOURCE  # the default data_source of write_task: verl's default scorer handles it as is


@dataclass(frozen=True)
class Problem:
    family: str
    question: str
    answer: int

    @property
    def target(self) -> str:
        """The response a perfect model writes (what the warm-up imitates and the verifier accepts)."""
        return f"#### {self.answer}"


@dataclass(frozen=True)
class Family:
    """One kind of problem: its wordings and the operand ranges (inclusive) of ``a`` and ``b``."""

    name: str
    templates: tuple[str, ...]
    a_range: tuple[int, int]
    b_range: tuple[int, int]
    answer: Callable[[int, int], int]

    def _problem(self, template: str, a: int, b: int) -> Problem:
        return Problem(self.name, template.format(a=a, b=b), self.answer(a, b))

    def draw(self, rng: random.Random) -> Problem:
        template = rng.choice(self.templates)
        return self._problem(template, rng.randint(*self.a_range), rng.randint(*self.b_range))

    @property
    def size(self) -> int:
        """The number of distinct problems (wordings x values of a x values of b)."""
        return len(self.templates) * (self.a_range[1] - self.a_range[0] + 1) * (self.b_range[1] - self.b_range[0] + 1)

    def problem_at(self, index: int) -> Problem:
        """The ``index``-th distinct problem, 0 <= index < size, in a fixed order."""
        b_count = self.b_range[1] - self.b_range[0] + 1
        a_count = self.a_range[1] - self.a_range[0] + 1
        rest, b = divmod(index, b_count)
        template, a = divmod(rest, a_count)
        return self._problem(self.templates[template], self.a_range[0] + a, self.b_range[0] + b)

    def space(self) -> list[Problem]:
        """Every distinct problem of the family, in a fixed order."""
        return [self.problem_at(i) for i in range(self.size)]


# From easy to hard for a 2-layer model: copying, few facts to memorise, more facts, times tables, carrying sums.
FAMILIES = {
    f.name: f
    for f in (
        Family("echo", ("Repeat the number {a}.", "Write down {a}."), (0, 99), (0, 0), lambda a, b: a),
        Family("tiny_sum", ("What is {a} + {b}?", "{a} plus {b} equals what?"), (0, 4), (0, 4), lambda a, b: a + b),
        Family("small_sum", ("Add {a} and {b}.", "Find the total of {a} and {b}."), (0, 9), (0, 9),
               lambda a, b: a + b),
        Family("product", ("Multiply {a} by {b}.", "What is the product of {a} and {b}?"), (2, 12), (2, 12),
               lambda a, b: a * b),
        Family("big_sum", ("Compute the sum of {a} and {b}.", "How much is {a} plus {b} in total?"), (10, 99),
               (10, 99), lambda a, b: a + b),
    )
}


# The widened task of the no-revisit regime (issue 29, results/token_lab/lab_token.md): enough distinct problems per
# family for a pool of 1,024 a family that no run draws twice. The same five wordings-and-kinds, from easy to hard, with
# wider operands: copying three digits instead of two; a 0-4 added to a number up to 199 (was: both 0-4); a digit
# added to a number up to 99 (was: two digits); times tables up to 99 x 12 (was: 12 x 12); two-digit sums as big_sum's.
# Its own family names, so that no report mixes the two tasks' families.
WIDE_FAMILIES = {
    f.name: f
    for f in (
        Family("echo3", ("Repeat the number {a}.", "Write down {a}."), (0, 999), (0, 0), lambda a, b: a),
        Family("plus_tiny", ("What is {a} + {b}?", "{a} plus {b} equals what?"), (0, 199), (0, 4),
               lambda a, b: a + b),
        Family("plus_digit", ("Add {a} and {b}.", "Find the total of {a} and {b}."), (0, 99), (0, 9),
               lambda a, b: a + b),
        Family("times_12", ("Multiply {a} by {b}.", "What is the product of {a} and {b}?"), (2, 99), (2, 12),
               lambda a, b: a * b),
        Family("sum_2digit", ("Compute the sum of {a} and {b}.", "How much is {a} plus {b} in total?"), (10, 99),
               (10, 99), lambda a, b: a + b),
    )
}
# The cold start (results/fair_verdict.md, section 3): the wide families whose held-out pass rate at step 0 was at
# most 0.05 over the pretrained-LM comparison's committed runs (plus_digit 0.047, times_12 0.027, sum_2digit 0.023),
# so that most of GRPO's groups start all-wrong. The same families, under the same names, as the wide task's.
COLD_FAMILIES = {name: WIDE_FAMILIES[name] for name in ("plus_digit", "times_12", "sum_2digit")}
TASKS = {"demo": FAMILIES, "wide": WIDE_FAMILIES, "cold": COLD_FAMILIES}


def families_of(task: str) -> dict[str, Family]:
    """The families of a task: ``demo`` (the first demo's), ``wide`` (the no-revisit regime's) or ``cold`` (its cold
    start's)."""
    if task not in TASKS:
        raise ValueError(f"task {task!r} is not one of {sorted(TASKS)}")
    return TASKS[task]


def even_shares(n: int, parts: int) -> list[int]:
    """``n`` split over ``parts`` as evenly as it goes, the first parts taking the remainder."""
    return [n // parts + (i < n % parts) for i in range(parts)]


def interleave(chosen: list[list[Problem]]) -> list[Problem]:
    """One problem of each family in turn (round robin), so that every stretch of rows covers every family."""
    return [group[i] for i in range(max(map(len, chosen))) for group in chosen if i < len(group)]


def make_problems(n: int, seed: int, exclude: Collection[str] = (), task: str = "demo") -> list[Problem]:
    """``n`` problems drawn evenly over the task's families (round robin), reproducible from ``seed``.

    Questions in ``exclude`` (the held-out split) are never drawn.
    """
    excluded = set(exclude)
    families = families_of(task)
    for family in families.values():
        # only a family with no more prompts than the exclusion list can be excluded whole
        if family.size <= len(excluded) and all(p.question in excluded for p in family.space()):
            raise ValueError(f"every prompt of family '{family.name}' is excluded; hold out fewer prompts")
    rng = random.Random(seed)
    families = list(families.values())
    problems = []
    for i in range(n):
        problem = families[i % len(families)].draw(rng)
        while problem.question in excluded:
            problem = families[i % len(families)].draw(rng)
        problems.append(problem)
    return problems


def distinct_problems(n: int, seed: int, exclude: Collection[str] = (), task: str = "demo") -> list[Problem]:
    """``n`` problems evenly over the task's families (round robin), no question twice and none in ``exclude``.

    The no-revisit regime's pools (issue 29): a run that walks them once never sees a prompt twice. Raises
    ValueError where a family has too few problems outside ``exclude`` for its share.
    """
    excluded = set(exclude)
    rng = random.Random(seed)
    families = list(families_of(task).values())
    shares = even_shares(n, len(families))
    spaces = [[p for p in family.space() if p.question not in excluded] for family in families]
    for family, space, share in zip(families, spaces, shares, strict=True):
        if share > len(space):
            raise ValueError(f"family '{family.name}' of task {task!r} has {len(space)} problems outside the held-out "
                             f"split, fewer than its share {share} of {n} distinct problems: ask for at most "
                             f"{min(map(len, spaces)) * len(families)}, or use a wider task ({sorted(TASKS)})")
    return interleave([rng.sample(space, share) for space, share in zip(spaces, shares, strict=True)])


def max_held_out(task: str) -> int:
    """The most held-out prompts ``task`` gives: half of its smallest family (the other half stays for training) in
    each of its families."""
    families = families_of(task).values()
    return min(f.size for f in families) // 2 * len(families)


def held_out_problems(n: int, seed: int, task: str = "demo") -> list[Problem]:
    """``n`` distinct problems, evenly over the families (round robin): the validation split.

    Each family's prompts are drawn without replacement from its whole space with ``seed``, so the split never
    repeats a prompt and is the same for every use of the seed.
    """
    rng = random.Random(seed)
    families = list(families_of(task).values())
    per_family = even_shares(n, len(families))
    chosen = []
    for family, k in zip(families, per_family, strict=True):
        # keep at least half of a family's prompts for training, so that the family is still trained on
        if k > family.size // 2:
            raise ValueError(f"{n} held-out prompts take {k} of family '{family.name}', which has only "
                             f"{family.size}; use at most {max_held_out(task)}")
        chosen.append([family.problem_at(i) for i in rng.sample(range(family.size), k)])
    return interleave(chosen)  # the first rows of the file cover every family


def assert_disjoint(train_questions: Collection[str], val_questions: Collection[str]) -> None:
    """Raises if a validation prompt is also a training prompt (the split would not be held out)."""
    shared = set(train_questions) & set(val_questions)
    if shared:
        example = sorted(shared)[0]
        raise AssertionError(f"{len(shared)} validation prompts are also training prompts, e.g. {example!r}")


def family_source(family: str) -> str:
    """The data_source of a family's rows when each family is its own source (verl then validates per family)."""
    return family


def to_verl_frame(problems: list[Problem], split: str, per_family_sources: bool = False,
                  instruction: str = "") -> pd.DataFrame:
    """Rows as verl's RLHFDataset reads them (chat prompt, rule reward with ground truth, extra_info).

    With ``per_family_sources`` each row's data_source is its family, which makes verl report validation metrics
    per family (val-core/<family>/...) and needs the demo's reward function (instruments/run/reward.py), since
    verl's default scorer only knows its own sources. ``instruction`` follows every question (a pretrained model is
    told how to answer; the tiny model learnt it in its warm-up); ``extra_info["question"]`` is the prompt as sent.
    """
    return pd.DataFrame(
        [
            {
                "data_source": family_source(p.family) if per_family_sources else DATA_SOURCE,
                "prompt": [{"role": "user", "content": p.question + instruction}],
                "ability": "math",
                "reward_model": {"style": "rule", "ground_truth": str(p.answer)},
                "extra_info": {"split": split, "index": i, "question": p.question + instruction, "family": p.family},
            }
            for i, p in enumerate(problems)
        ]
    )


def write_task(out_dir: Path, n_train: int, n_val: int, seed: int, per_family_sources: bool = False,
               task: str = "demo", distinct: bool = False, instruction: str = "") -> tuple[Path, Path]:
    """Writes train.parquet (``n_train`` draws) and val.parquet (``n_val`` held-out prompts) under ``out_dir``.

    ``distinct``: the training rows are ``n_train`` different problems (:func:`distinct_problems`), for a run that
    must never see a prompt twice; otherwise they are drawn with replacement (:func:`make_problems`).
    """
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = out_dir / "train.parquet", out_dir / "val.parquet"
    val = held_out_problems(n_val, seed, task=task)
    draw = distinct_problems if distinct else make_problems
    train = draw(n_train, seed, exclude={p.question for p in val}, task=task)
    assert_disjoint([p.question for p in train], [p.question for p in val])
    to_verl_frame(train, "train", per_family_sources, instruction).to_parquet(paths[0])
    to_verl_frame(val, "val", per_family_sources, instruction).to_parquet(paths[1])
    return paths


def read_questions(parquet: Path) -> list[str]:
    """The user prompt of every row of a verl parquet file written by :func:`write_task`."""
    return [row[-1]["content"] for row in pd.read_parquet(parquet, columns=["prompt"])["prompt"]]
