"""Kept so that ``reward.custom_reward_function.path=pkg://bv_blend.rewards`` keeps working: the reward now
lives in the paper kit, :mod:`bv_blend.paper.rewards`."""

from bv_blend.paper.rewards import answer_parses, compute_score, get_pool, verify_answer

__all__ = ["answer_parses", "compute_score", "get_pool", "verify_answer"]
