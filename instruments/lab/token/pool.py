"""Which prompts a step trains on: a fixed pool of training problems, revisited over a run.

The pool is the same set of problems for every arm and seed, evenly over the task's five families (as the demo's
training data is) and disjoint from the held-out split. Within a family the problems are distinct while its
training space lasts; tiny_sum has 26 prompts outside the split, so its share of a larger pool repeats them
(the demo's training data repeats them too).

Without the sampler, a run walks the pool in epochs: each epoch is a fresh permutation of the pool (from the run's
seed), and a step takes the next ``prompts_per_step`` problems. The pool's size is a multiple of every arm's
prompts per step, so a step never straddles two epochs and never holds a prompt twice; a seed gives every arm the
same order of problems (an arm with more prompts a step goes through it faster). With the sampler, each step
draws its prompts from the whole pool by the estimator's own success estimates (:func:`sampled_prompts`).
"""

from __future__ import annotations

import random
from collections.abc import Collection

import numpy as np

from instruments.demo.task import Problem, even_shares, families_of, interleave


def training_pool(size: int, seed: int, held_out: Collection[str], task: str = "demo") -> list[Problem]:
    """``size`` problems, round robin over the task's families, none of them in ``held_out``."""
    rng = random.Random(seed)
    families = list(families_of(task).values())
    chosen = []
    for family, share in zip(families, even_shares(size, len(families)), strict=True):
        space = [p for p in family.space() if p.question not in held_out]
        rng.shuffle(space)
        chosen.append([space[i % len(space)] for i in range(share)])
    return interleave(chosen)


class PromptOrder:
    """The pool's indices in seeded epochs; :meth:`take` hands out the next ``k`` of them."""

    def __init__(self, pool_size: int, seed: int) -> None:
        self.pool_size = pool_size
        self.rng = np.random.default_rng([seed, 0])  # its own stream: sampling responses does not move it
        self.epoch = self.rng.permutation(pool_size)
        self.position = 0

    def take(self, k: int) -> np.ndarray:
        if self.pool_size % k:
            raise ValueError(f"a pool of {self.pool_size} is not a multiple of {k} prompts a step")
        if self.position == self.pool_size:
            self.epoch, self.position = self.rng.permutation(self.pool_size), 0
        out = self.epoch[self.position:self.position + k]
        self.position += k
        return out


def sampled_prompts(algorithm: object, pool_keys: np.ndarray, pool_clusters: np.ndarray, k: int,
                    rng: np.random.Generator) -> np.ndarray:
    """``k`` distinct pool indices drawn by the prompt sampler, for the arms with ``sampler=True``.

    p_hat per prompt is the estimator's own success estimate from its history (bv_blend.verl.offline.
    success_estimates, keyed like the advantages: prompt key and cluster); the sampler weighs each prompt by
    sqrt(p (1 - p)) + 0.05 (bv_blend.history.sampler.prompt_weights) and draws without replacement: the
    same functions the verl sampler calls.
    """
    from bv_blend.history import sampler
    from bv_blend.verl import offline

    p_hat = offline.success_estimates(algorithm, pool_keys, pool_clusters)
    return np.asarray(sampler.draw(sampler.prompt_weights(p_hat), k, rng), dtype=np.int64)
