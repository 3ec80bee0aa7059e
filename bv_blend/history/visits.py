"""How often a training run revisits its prompts, from its size alone (issue 29's start-time advisor), verl-free.

A per-prompt history acts on a row only when the row's prompt has a history already: from a prior (offline values,
history_spec 4) or from an earlier visit. Before training starts the sizes say how many rows that will be:

    N  training prompts            B  prompts per step (train_batch_size)            s  training steps
    D  = s B                       prompt draws over the run (one visit each; its n rollouts share its history)
    V  = D / N                     expected visits per prompt

Every function is pure; the verl glue (``bv_blend.verl.advisor``) reads the sizes from the trainer's config.
"""

from __future__ import annotations

from dataclasses import dataclass


def planned_steps(prompts: int, batch_size: int, total_epochs: int, total_training_steps: int | None = None) -> int:
    """The steps a run trains: ``total_epochs`` epochs of ``prompts // batch_size`` steps (verl drops the last
    partial batch), stopped earlier at ``total_training_steps`` when it is set: verl's loop ends at whichever comes
    first, s = min(total_training_steps, total_epochs (N // B))."""
    by_epochs = total_epochs * (prompts // batch_size) if batch_size > 0 else 0
    return by_epochs if total_training_steps is None else min(int(total_training_steps), by_epochs)


def visits_per_prompt(prompts: int, batch_size: int, steps: int) -> float:
    """V = D / N = s B / N, the expected visits of one prompt over the run (0 for an empty dataset)."""
    return steps * batch_size / prompts if prompts > 0 else 0.0


def epoch_history_share(prompts: int, batch_size: int, steps: int) -> float:
    """The share of rows whose prompt has a history from an earlier visit, under verl's own samplers (shuffled or
    sequential epochs: without replacement within an epoch).

    A visit has a history iff it is not the prompt's first. The first visits are the distinct prompts drawn,
    min(N, D) (each epoch draws (N // B) B <= N distinct prompts; the N mod B left out of one epoch are taken as
    drawn in the next), so

        share = 1 - min(N, D) / D

    which is 0 within the first epoch and 1 - 1/E after E whole epochs (4 epochs: 0.75).
    """
    draws = steps * batch_size
    return max(0.0, 1.0 - min(prompts, draws) / draws) if draws > 0 else 0.0


def independent_batches_history_share(prompts: int, batch_size: int, steps: int) -> float:
    """The same share under the history sampler (``data.history_sampler.enable``: each batch is B distinct prompts,
    drawn independently of the other batches).

    Its draws are weighted by each prompt's history; they are approximated here by uniform draws. A prompt is then in
    a batch with probability B / N, so after s batches the expected number of distinct prompts drawn is
    N (1 - (1 - B/N)^s), and

        share = 1 - N (1 - (1 - B/N)^s) / D

    (a little above :func:`epoch_history_share` at a few epochs' worth of steps: some prompts come back early, others
    not at all).
    """
    draws = steps * batch_size
    if draws <= 0 or prompts <= 0:
        return 0.0
    distinct = prompts * (1.0 - (1.0 - min(batch_size / prompts, 1.0)) ** steps)
    return max(0.0, 1.0 - distinct / draws)


@dataclass(frozen=True)
class Visits:
    """A run's revisits of its prompts, planned from its sizes.

    Attributes:
        prompts: N, the training prompts.
        batch_size: B, prompts per step.
        steps: s, the steps it trains.
        visits_per_prompt: V = s B / N.
        history_row_share: the share of rows whose prompt has a history when it is visited (1 with priors, which
            give every prompt one before its first visit).
    """

    prompts: int
    batch_size: int
    steps: int
    visits_per_prompt: float
    history_row_share: float


def plan_visits(prompts: int, batch_size: int, steps: int, history_sampler: bool = False,
                priors: float = 0.0) -> Visits:  # fmt: skip
    """The :class:`Visits` of a run: verl's epochs (:func:`epoch_history_share`) or the history sampler's
    independent batches (:func:`independent_batches_history_share`).

    ``priors`` is the share c of the training prompts that a prior file covers (``True``: all of them). A covered
    prompt has a history at every visit; the others only at their revisits, and they take (1 - c) of the draws, so
    the share is c + (1 - c) share_without_priors.
    """
    coverage = min(max(float(priors), 0.0), 1.0)
    if history_sampler:
        share = independent_batches_history_share(prompts, batch_size, steps)
    else:
        share = epoch_history_share(prompts, batch_size, steps)
    share = coverage + (1.0 - coverage) * share
    return Visits(prompts, batch_size, steps, visits_per_prompt(prompts, batch_size, steps), share)


__all__ = [
    "Visits",
    "epoch_history_share",
    "independent_batches_history_share",
    "plan_visits",
    "planned_steps",
    "visits_per_prompt",
]
