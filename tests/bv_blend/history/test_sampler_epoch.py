"""The history sampler's draw without replacement over an epoch, verl-free (history_spec 5, "Without replacement over
an epoch", and 6): no prompt twice within an epoch; with flat weights the epoch is a uniform random permutation; the
draws follow the weights among the prompts not yet drawn (chi-square tests, fixed seeds)."""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
from scipy import stats

from bv_blend.history import sampler as weights

# A test's p-value below this fails it: about one spurious failure in a thousand runs, were the seeds not fixed.
ALPHA = 1e-3


def draw_epoch(prompt_weights: np.ndarray, batch_size: int, rng: np.random.Generator) -> list[np.ndarray]:
    """One epoch as the sampler draws it: len // batch_size batches, each from the prompts not yet drawn."""
    drawn = np.zeros(prompt_weights.size, dtype=bool)
    batches = []
    for _ in range(prompt_weights.size // batch_size):
        batch = weights.draw_from_remaining(prompt_weights, batch_size, drawn, rng)
        drawn[batch] = True
        batches.append(batch)
    return batches


def test_no_prompt_comes_twice_in_an_epoch_and_the_weights_leave_the_tail_out():
    """23 prompts in batches of 5: four batches, 20 distinct prompts; the 3 left are not drawn in this epoch, as
    verl's drop_last leaves out its permutation's tail, and no fifth batch can be drawn from them."""
    rng = np.random.default_rng(0)
    prompt_weights = weights.prompt_weights(rng.random(23))
    for _ in range(20):
        batches = draw_epoch(prompt_weights, 5, rng)
        drawn = np.concatenate(batches)
        assert len(batches) == 4 and all(batch.size == 5 for batch in batches)
        assert np.unique(drawn).size == drawn.size == 20
    mask = np.zeros(23, dtype=bool)
    mask[drawn] = True
    with pytest.raises(ValueError, match="A batch of 5 distinct prompts cannot be drawn from the 3 not yet drawn"):
        weights.draw_from_remaining(prompt_weights, 5, mask, rng)


def test_with_flat_weights_an_epoch_is_a_uniform_random_permutation():
    """4 prompts in batches of 2 over 12,000 seeds: each of the 24 orders about equally often."""
    flat = np.ones(4)
    counts = dict.fromkeys(itertools.permutations(range(4)), 0)
    for seed in range(12_000):
        counts[tuple(np.concatenate(draw_epoch(flat, 2, np.random.default_rng(seed))).tolist())] += 1
    assert len(counts) == math.factorial(4)
    assert stats.chisquare(list(counts.values())).pvalue > ALPHA


def test_with_flat_weights_every_prompt_is_equally_likely_at_every_position():
    """12 prompts in batches of 3 over 6,000 seeds: the first, a middle and the last position of the epoch are each
    uniform over the prompts (chi-square on the first-position frequencies, and the others')."""
    flat = np.ones(12)
    epochs = np.array([np.concatenate(draw_epoch(flat, 3, np.random.default_rng(seed))) for seed in range(6_000)])
    for position in (0, 5, 11):
        frequencies = np.bincount(epochs[:, position], minlength=12)
        assert stats.chisquare(frequencies).pvalue > ALPHA, position


def test_the_draws_follow_the_weights_among_the_prompts_not_yet_drawn():
    """One prompt a draw, prompts 1, 4 and 6 (the heaviest among them) already drawn: the others come in proportion to
    their weights (chi-square over 20,000 draws), the drawn ones never."""
    prompt_weights = np.array([0.05, 0.55, 0.3, 0.1, 0.5, 0.2, 0.45, 0.15])
    drawn = np.zeros(8, dtype=bool)
    drawn[[1, 4, 6]] = True
    rng = np.random.default_rng(0)
    counts = np.bincount([weights.draw_from_remaining(prompt_weights, 1, drawn, rng)[0] for _ in range(20_000)],
                         minlength=8)  # fmt: skip
    assert counts[drawn].sum() == 0
    remaining = prompt_weights[~drawn]
    assert stats.chisquare(counts[~drawn], f_exp=20_000 * remaining / remaining.sum()).pvalue > ALPHA


def test_a_batch_is_successive_draws_by_the_weights_among_the_remaining():
    """Two prompts a batch from the five not drawn: the ordered pair (i, j) comes with probability
    w_i / W * w_j / (W - w_i), each draw by the weights among the prompts neither drawn in the epoch nor in the batch
    (chi-square over the 20 ordered pairs, 30,000 batches)."""
    prompt_weights = np.array([0.05, 0.55, 0.3, 0.1, 0.5, 0.2, 0.45])
    drawn = np.zeros(7, dtype=bool)
    drawn[[2, 6]] = True
    remaining = np.flatnonzero(~drawn).tolist()
    total = prompt_weights[remaining].sum()
    pairs = list(itertools.permutations(remaining, 2))
    expected = np.array([prompt_weights[i] / total * prompt_weights[j] / (total - prompt_weights[i]) for i, j in pairs])
    assert expected.sum() == pytest.approx(1.0)
    rng = np.random.default_rng(1)
    counts = dict.fromkeys(pairs, 0)
    for _ in range(30_000):
        counts[tuple(weights.draw_from_remaining(prompt_weights, 2, drawn, rng).tolist())] += 1
    assert len(counts) == len(pairs)  # no drawn prompt, no pair with a repeat
    assert stats.chisquare(list(counts.values()), f_exp=30_000 * expected).pvalue > ALPHA


def test_the_first_batch_of_an_epoch_is_the_plain_draw_from_the_same_rng():
    """With nothing drawn yet the epoch's draw is the sampler's plain one: the option changes only what comes after."""
    prompt_weights = weights.prompt_weights(np.linspace(0, 1, 30))
    plain = weights.draw(prompt_weights, 6, np.random.default_rng(3))
    epoch = weights.draw_from_remaining(prompt_weights, 6, np.zeros(30, dtype=bool), np.random.default_rng(3))
    np.testing.assert_array_equal(plain, epoch)


@pytest.mark.parametrize(
    ("drawn", "message"),
    [
        (np.zeros(5, dtype=bool), r"boolean array of the weights' shape \(6,\); it is a bool array of shape \(5,\)"),
        (np.zeros(6, dtype=np.int64), r"boolean array of the weights' shape \(6,\); it is a int64 array"),
        (np.array([True] * 5 + [False]), "A batch of 2 distinct prompts cannot be drawn from the 1 not yet drawn"),
    ],
)  # fmt: skip
def test_a_mask_that_does_not_fit_is_refused_by_name(drawn, message):
    with pytest.raises(ValueError, match=message):
        weights.draw_from_remaining(np.ones(6), 2, drawn, np.random.default_rng(0))
