"""One run's advantages: verl's registered estimator, called through ``bv_blend.verl.offline`` as verl's trainer
calls it (the logistic lab's instruments/lab/estimators.py does the same with one token per response).

A step's batch, as verl builds it: ``token_level_rewards`` (B, R) with the verifier's 0/1 score on each response's
last valid token (its EOS, or the last token when it ran out of length), the response mask (B, R), one uid per
prompt and step (the rows of a group share it), verl's default ``config.algorithm`` with the arm's options merged
in, and each row's cluster id (its task family). Arms that key a history by prompt also get a prompt key per row
(its question text, stable across steps); ``prompt_keys`` is passed only to them.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np
import torch

from bv_blend.verl import offline
from instruments.lab.token.arms import TokenArm


def token_level_rewards(scores: torch.Tensor, response_mask: torch.Tensor) -> torch.Tensor:
    """(B, R) float rewards: each response's score on its last valid token, zeros elsewhere (verl's layout)."""
    last = (response_mask.sum(1) - 1).clamp(min=0).long()
    rewards = torch.zeros(response_mask.shape, dtype=torch.float32)
    rewards[torch.arange(len(scores)), last] = scores.float()
    return rewards


class TokenAdvantages:
    """Starts the arm's estimator with an empty history, or from the prior file (``priors``) as verl's trainer start
    does, given the pool's prompts and their clusters (``prompts``: key -> cluster id; BV-Blend pools its priors by
    them); then maps a step's batch to verl's (B, R) advantages."""

    def __init__(self, arm: TokenArm, num_clusters: int, priors: str | None = None,
                 prompts: Mapping[str, int] | None = None) -> None:  # fmt: skip
        self.arm = arm
        if arm.oracle == "baseline":  # no verl estimator: the run computes R - p (oracle_baseline)
            self.algorithm = None
            return
        self.algorithm = offline.algorithm_config(arm.adv_estimator, arm.algorithm_options(num_clusters, priors))
        offline.reset_history(arm.adv_estimator)
        if arm.priors and priors is not None:
            if prompts is None:
                raise ValueError(f"{arm.label}: its prior file needs the pool's prompts and their clusters (prompts=).")
            offline.start_run(self.algorithm, prompts)

    def __call__(
        self,
        scores: torch.Tensor,
        response_mask: torch.Tensor,
        uids: np.ndarray,
        cluster_ids: np.ndarray,
        prompt_keys: np.ndarray,
    ) -> torch.Tensor:
        """(B, R) advantages for B rows: 0/1 scores (B,), mask (B, R), uids, cluster ids and prompt keys (B,)."""
        extra = {"prompt_keys": prompt_keys} if self.arm.needs_prompt_keys else {}
        return offline.compute_advantages(
            token_level_rewards(scores, response_mask),
            response_mask,
            uids,
            self.algorithm,
            cluster_ids=np.asarray(cluster_ids),
            **extra,
        )


def oracle_baseline(scores: torch.Tensor, response_mask: torch.Tensor, p: np.ndarray) -> torch.Tensor:
    """(B, R) advantages R - p^ on every response token: the no-revisit regime's baseline limit (p^ is the prompt's
    success rate estimated from 8 responses that are not rollouts, not the true p; results/regime.md, addendum)."""
    return (scores.float() - torch.as_tensor(p, dtype=torch.float32))[:, None] * response_mask.float()
