#!/usr/bin/env bash
# The project's test command: sets up .venv on a fresh machine, lints, then runs the whole test suite.
# Extra arguments go to pytest. The fast tier for the inner loop (everything but verl's trainer runs, under 8 min):
#   bash scripts/test.sh -m "not e2e"
# Three pytest-xdist workers on two cores: the two groups of trainer runs (tests/e2e, each an xdist_group of its
# own: `--dist loadgroup` keeps a group on one worker) use about one core each, mostly in start-up, and the third
# worker runs the unit tests beside them; --no-loadscope-reorder keeps the order tests/conftest.py gives (the trainer
# groups first), where xdist would order groups by their number of tests. `-n 0` runs everything in one process.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled
.venv/bin/ruff check bv_blend instruments hydra_plugins scripts tests
# --durations: the slowest tests close every log, so a slow machine's run says where its time went (README, "The test
# budget by kind of CPU").
.venv/bin/python -m pytest -n 3 --dist loadgroup --no-loadscope-reorder --durations=15 "$@"
