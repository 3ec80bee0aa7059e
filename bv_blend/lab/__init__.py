"""The estimator lab: a fast simulation of RLVR training in which every estimator, verl's and ours, is compared
on the same random numbers (``scripts/lab.py``, ``docs/lab.md``)."""
