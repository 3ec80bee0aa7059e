"""The family's other advantage estimators and loss math, beside BV-Blend (whose core sits at the top of the
package): HA-DW, MaxNorm-AC, negative token filtering (docs: the companions spec).

Each module here is verl-free, tensors in and out, one function or small class per method, readable beside its
paper; the verl glue that registers them lives in ``bv_blend/verl/``.
"""
