"""The estimator lab: a fast simulation of RLVR training in which every estimator sees the same random numbers.

Read top-down: ``env`` (the task and the policy), ``optim`` (SGD, Adam with verl's clip), ``estimators`` (the
table of estimators, run through verl's own functions), ``run`` (one run), ``metrics``, ``suites`` (the
experiments), ``execute`` (running them, paired by seed), ``report`` (lab.md and the plots). results/lab.md has the
results; ``python scripts/lab.py --suite quick --out DIR`` reproduces them.
"""
