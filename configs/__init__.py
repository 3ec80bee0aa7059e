"""Hydra configs of bv_blend, importable as ``pkg://bv_blend.configs`` once the package is installed."""
