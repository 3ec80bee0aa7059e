#!/usr/bin/env bash
# The README's main job: GRPO vs BV-Blend with verl's stock trainer on CPU, validated on held-out prompts
# (docs/cpu.md, "The demo"). On SmolLM2, 78 minutes on 2 cores without AMX (fp32; about 25 estimated with
# AMX); --model tiny about 18. Extra arguments go to scripts/demo_cpu.py (e.g. --steps 8 --test-freq 8: shorter).
# It runs where you call it from: --model and --work-dir paths (default demo_out/) are read from there.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
for arg in "$@"; do  # the options, without minutes of set-up first, where the environment exists
  if [[ "$arg" == "-h" || "$arg" == "--help" ]] && [ -x "$ROOT/.venv/bin/python" ]; then
    exec "$ROOT/.venv/bin/python" "$ROOT/scripts/demo_cpu.py" --help
  fi
done
bash "$ROOT/scripts/setup_env.sh"
export HF_HUB_OFFLINE=1 TRANSFORMERS_OFFLINE=1 HF_DATASETS_OFFLINE=1 TOKENIZERS_PARALLELISM=false WANDB_MODE=disabled
exec "$ROOT/.venv/bin/python" "$ROOT/scripts/demo_cpu.py" "$@"
