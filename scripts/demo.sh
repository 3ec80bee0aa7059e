#!/usr/bin/env bash
# The README's main job: GRPO vs BV-Blend with verl's stock trainer on CPU, validated on held-out prompts
# (docs/cpu.md, "The demo"). On SmolLM2, 78 minutes on 2 cores without AMX (fp32; about 25 estimated with
# AMX); --model tiny about 18. Extra arguments go to scripts/demo_cpu.py (e.g. --steps 8 --test-freq 8: shorter).
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/setup_env.sh
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled
.venv/bin/python scripts/demo_cpu.py "$@"
