"""Data preparation for the paper's training set (OpenR1-Math-220k -> verl parquet)."""
