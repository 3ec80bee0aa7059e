"""Reward history below the cluster, verl-free: stable prompt keys, a sparse per-prompt table, offline priors, and the
prompt sampler's weights (history_spec sections 1, 4 and 5)."""
