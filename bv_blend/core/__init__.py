"""The layer every estimator shares, verl-free: checked rows, group statistics, option validation, cross-rank sync."""
