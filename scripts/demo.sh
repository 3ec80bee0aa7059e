#!/usr/bin/env bash
# The README's main job: BV-Blend's cluster level at n = 2 (the package's best arm in the committed pretrained-LM
# comparison) trained once by verl's stock trainer on CPU at that comparison's settings: SmolLM2-135M-Instruct, the
# wide task, 32 prompts x 2 rollouts a step with no training prompt twice, the lr and steps of
# results/regime/pretrained_lm_settings.json, fp32 on a CPU without AMX. It prints the held-out pass rate before and
# after with this run's 95% intervals, per family, "learned" only where the gain's interval lies above zero, labelled
# as one seed, beside the comparison's five-seed result of the same arm and GRPO n = 8 (docs/cpu.md, "The demo").
# The measured wall time is in the README. Extra arguments go to scripts/demo_cpu.py (--help lists them; e.g.
# --steps 4: shorter, and no longer the comparison's setting, which the report then says). It runs where you call it
# from: --model and --work-dir paths (default demo_out/) are read from there.
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
