"""``bv-blend doctor`` (or ``python -m bv_blend.verl.doctor``): why does verl say "Unknown advantage estimator
simply: bv_blend"?

Checks, each in a fresh interpreter so that nothing imported here hides a problem: the entry point is installed;
a plain ``import verl`` registers every estimator and policy loss of ``records.py``, and verl instantiates NTF's
policy-loss config; the trainer hooks install on this verl. Exit code 0 when all pass.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from collections.abc import Iterator
from importlib.metadata import entry_points

from bv_blend.verl.records import POLICY_LOSSES, RECORDS
from bv_blend.verl.versions import installed_version

PROBE_REGISTRY = (
    "import verl\n"
    "from verl.trainer.ppo.core_algos import get_adv_estimator_fn, get_policy_loss_fn\n"
    "from verl.utils.config import omega_conf_to_dataclass\n"
    "from bv_blend.verl.glue.ntf import TARGET\n"
    "from bv_blend.verl.plugin import ESTIMATORS, POLICY_LOSSES\n"
    "found = {name: get_adv_estimator_fn(name) for name in ESTIMATORS}\n"
    "found.update({name: get_policy_loss_fn(name) for name in POLICY_LOSSES})\n"
    "config = omega_conf_to_dataclass({'_target_': TARGET, 'loss_mode': 'ntf', 'ntf_keep_ratio': 0.1})\n"
    "assert type(config).__name__ == 'NTFPolicyLossConfig', config\n"
    "print(', '.join(f'{name} -> {fn.__module__}.{fn.__qualname__}' for name, fn in found.items()))\n"
)
PROBE_HOOKS = (
    "import verl\n"
    "import verl.trainer.ppo.ray_trainer as legacy\n"
    "import verl.trainer.ppo.v1.trainer_base as v1\n"
    "from bv_blend.verl import runtime\n"
    "from bv_blend.verl.patching import is_wrapped\n"
    "names = ('__init__', '_compute_advantage', '_compute_metrics', '_save_checkpoint', '_load_checkpoint')\n"
    "targets = [(v1.PPOTrainer, n) for n in names]\n"
    "targets += [(legacy.RayPPOTrainer, n) for n in ('__init__', '_save_checkpoint', '_load_checkpoint')]\n"
    "targets += [(legacy, 'compute_advantage'), (legacy, 'compute_data_metrics')]\n"
    "missing = [getattr(o, '__name__', o) + '.' + n for o, n in targets if not is_wrapped(o, n)]\n"
    "assert not missing and not runtime.RUN.hook_errors, (missing, runtime.RUN.hook_errors)\n"
    "print(f'{len(targets)} hooks installed')\n"
)


def _probe(code: str, env: dict[str, str]) -> tuple[bool, str]:
    proc = subprocess.run([sys.executable, "-W", "ignore", "-c", code], env=env, capture_output=True, text=True)
    lines = (proc.stdout.strip() or proc.stderr.strip()).splitlines()
    return proc.returncode == 0, (lines[-1] if lines else f"exit code {proc.returncode}")


def iter_checks(env: dict[str, str] | None = None) -> Iterator[tuple[str, bool, str]]:
    """``(check, passed, detail)`` for each check, as it finishes (each probe starts a fresh interpreter: seconds)."""
    env = dict(os.environ if env is None else env)
    for dist in ("bv-blend", "verl", "transferqueue"):
        found = installed_version(dist)
        yield f"{dist} installed", found is not None, found or "not installed in this Python"
    ours = [ep for ep in entry_points(group="verl.plugins") if ep.value.startswith("bv_blend")]
    yield (
        "entry point verl.plugins",
        bool(ours),
        ", ".join(f"{ep.name} = {ep.value}" for ep in ours) or "missing: reinstall with `pip install bv-blend`",
    )
    policy = env.get("VERL_USE_EXTERNAL_PLUGINS", "auto")
    modules = env.get("VERL_USE_EXTERNAL_MODULES", "")
    yield "VERL_USE_EXTERNAL_PLUGINS / _MODULES", True, f"{policy!r} / {modules!r}"
    ours_by_name = ", ".join([*(record.name for record in RECORDS), *POLICY_LOSSES])
    yield f"`import verl` registers {ours_by_name}", *_probe(PROBE_REGISTRY, env)
    loud = dict(env, VERL_USE_EXTERNAL_PLUGINS="none", VERL_USE_EXTERNAL_MODULES="bv_blend.verl.plugin")
    yield "loud route VERL_USE_EXTERNAL_MODULES", *_probe(PROBE_REGISTRY, loud)
    yield "trainer hooks (V1 and legacy)", *_probe(PROBE_HOOKS, env)


def print_checks(env: dict[str, str] | None = None) -> int:
    """Print each check as it finishes (the probes take seconds each), then the fix if one failed; the exit code."""
    failed = False
    for name, passed, detail in iter_checks(env):
        print(f"[{'ok' if passed else 'FAIL'}] {name}: {detail}", flush=True)
        failed = failed or not passed
    if failed:
        print(
            "\nFix: `pip install bv-blend` in the Python that runs verl (every node). If the entry point is present "
            "but registration fails, run with VERL_USE_EXTERNAL_MODULES=bv_blend.verl.plugin: the import error "
            "then stops verl with its traceback instead of being swallowed."
        )
        return 1
    return 0


def main(argv: list[str] | None = None) -> int:
    argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter).parse_args(argv)
    return print_checks()


if __name__ == "__main__":
    sys.exit(main())
