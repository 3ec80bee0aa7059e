"""The token-level lab: the demo's tiny Qwen2 trained with RL on the demo's task, one estimator per arm.

Between the logistic lab (instruments/lab, one token per response, seconds a run) and verl's CPU trainer
(scripts/compare_cpu.py, ~10 minutes a run) sits this lab: the demo's model, tokenizer, warm-up, task, held-out
split and verifier (instruments/demo), HF sampling at T=1, verl's token-mean policy-gradient loss with AdamW and
clipping (the stand-in's loop, instruments/demo/standin.py), and every advantage computed by verl's own registered
estimator through ``bv_blend.verl.offline`` (the face the logistic lab uses). A run takes a minute or two.

Read top-down: ``arms`` (what is compared, as data), ``pool`` (which prompts a step trains on), ``advantages``
(the call into verl), ``run`` (one run), ``suites`` (quick, full, select), ``store`` and ``runner`` (result files,
resume, worker processes), ``stats``, ``selection``, ``plots`` and ``report``; the no-revisit regime (issue 29):
``assets`` (the codebook's clusters of the pool, the offline priors) and ``regime`` (its summary and report).
The face is scripts/lab_token.py; results/token_lab/lab_token.md is the full suite's report, results/token_lab/token_lab.md the
regime's.
"""
