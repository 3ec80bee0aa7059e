#!/usr/bin/env bash
# The project's test command: sets up .venv on a fresh machine, lints, then runs the whole test suite.
# Extra arguments go to pytest, e.g. `bash scripts/test.sh -m "not e2e"`.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled
.venv/bin/ruff check bv_blend instruments hydra_plugins scripts tests
.venv/bin/python -m pytest "$@"
