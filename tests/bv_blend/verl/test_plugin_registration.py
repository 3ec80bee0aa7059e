"""Registration through verl's own plugin loading, each scenario in a fresh interpreter (``import verl``).

The four interpreters start together (one ``import verl`` takes 10-30 s on this machine).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

# one worker runs this module: its module fixture is costly, and pytest-xdist would build it again on every
# worker that gets one of its tests (scripts/test.sh: --dist loadgroup)
pytestmark = [pytest.mark.slow, pytest.mark.xdist_group("plugin_processes")]

HEAVY = (
    "verl.trainer.ppo.core_algos",
    "verl.trainer.ppo.ray_trainer",
    "verl.trainer.ppo.v1.trainer_base",
    "sentence_transformers",
    "vllm",
)
PROBE = f"""
import importlib, json, sys
import verl
out = {{"heavy_after_import_verl": [m for m in {HEAVY!r} if m in sys.modules]}}
if "bv_blend.verl.plugin" not in sys.modules:
    from verl.trainer.ppo import core_algos
    try:
        core_algos.get_adv_estimator_fn("bv_blend")
    except ValueError as exc:
        out["without_plugin"] = str(exc)
    before = set(sys.modules)
    import bv_blend.verl.plugin
    out["imported_by_plugin"] = sorted(m for m in set(sys.modules) - before if m.startswith({HEAVY!r}) or
                                       m == "transfer_queue")
from verl.trainer.ppo import core_algos
try:
    fn = core_algos.get_adv_estimator_fn("bv_blend")
    out["resolved"] = fn.__module__ + "." + fn.__qualname__
except ValueError as exc:
    out["resolved"] = str(exc)
import bv_blend.verl.plugin as plugin
importlib.reload(plugin)  # a second import of the entry module must not trip verl's duplicate check
importlib.reload(plugin)
out["after_reload"] = core_algos.get_adv_estimator_fn("bv_blend").__qualname__
out["companions"] = [core_algos.get_adv_estimator_fn(n).__qualname__ for n in ("ha_dw", "maxnorm_ac")]
out["companions"].append(core_algos.get_policy_loss_fn("ntf").__qualname__)
from bv_blend.verl import runtime
out["hook_errors"] = runtime.RUN.hook_errors
print("RESULT" + json.dumps(out))
"""
SCENARIOS = {
    "entry_point_alone": {"VERL_USE_EXTERNAL_PLUGINS": "auto", "VERL_USE_EXTERNAL_MODULES": ""},
    "loud_route_alone": {"VERL_USE_EXTERNAL_PLUGINS": "none", "VERL_USE_EXTERNAL_MODULES": "bv_blend.verl.plugin"},
    "both_routes": {"VERL_USE_EXTERNAL_PLUGINS": "auto", "VERL_USE_EXTERNAL_MODULES": "bv_blend.verl.plugin"},
    "no_plugin_loaded": {"VERL_USE_EXTERNAL_PLUGINS": "none", "VERL_USE_EXTERNAL_MODULES": ""},
}
EXPECTED = "bv_blend.verl.glue.bv_blend.compute_bv_blend_advantage"
COMPANIONS = ["compute_ha_dw_advantage", "compute_maxnorm_ac_advantage", "compute_policy_loss_ntf"]


@pytest.fixture(scope="module")
def results():
    procs = {
        name: subprocess.Popen(
            [sys.executable, "-W", "ignore", "-c", PROBE],
            env={**os.environ, **env},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for name, env in SCENARIOS.items()
    }
    out = {}
    for name, proc in procs.items():
        stdout, stderr = proc.communicate(timeout=300)
        assert proc.returncode == 0, (name, stderr[-3000:])
        out[name] = json.loads(stdout.split("RESULT")[-1])
    return out


@pytest.mark.parametrize("scenario", ["entry_point_alone", "loud_route_alone", "both_routes"])
def test_import_verl_registers_bv_blend(results, scenario):
    result = results[scenario]
    assert result["resolved"] == EXPECTED
    assert result["after_reload"] == "compute_bv_blend_advantage" and result["hook_errors"] == []
    assert result["companions"] == COMPANIONS


def test_plugin_registers_the_companions_when_imported_late(results):
    """Imported by hand after a bare `import verl` (VERL_USE_EXTERNAL_MODULES' case), every name registers too."""
    assert results["no_plugin_loaded"]["companions"] == COMPANIONS and results["no_plugin_loaded"]["hook_errors"] == []


def test_entry_module_is_light(results):
    """Loading the plugin inside `import verl` pulls in none of verl's trainers, core_algos or encoders."""
    for scenario in ("entry_point_alone", "loud_route_alone", "both_routes"):
        assert results[scenario]["heavy_after_import_verl"] == [], scenario
    # Imported by hand after a bare `import verl`: still nothing heavy, no transfer_queue of its own.
    assert results["no_plugin_loaded"]["imported_by_plugin"] == []


def test_without_plugin_verl_fails_with_unknown_estimator_until_plugin_imported(results):
    """The failure mode the doctor explains: with plugins off, verl alone does not know bv_blend; importing
    the entry module afterwards (as VERL_USE_EXTERNAL_MODULES would) registers it at once."""
    assert results["no_plugin_loaded"]["without_plugin"] == "Unknown advantage estimator simply: bv_blend"
    assert results["no_plugin_loaded"]["resolved"] == EXPECTED


def test_doctor_reports_all_checks_ok():
    proc = subprocess.run([sys.executable, "-m", "bv_blend.cli", "doctor"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    checks = ["bv-blend installed", "verl installed", "transferqueue installed", "entry point verl.plugins",
              "VERL_USE_EXTERNAL_PLUGINS / _MODULES", "`import verl` registers", "loud route VERL_USE_EXTERNAL_MODULES",
              "trainer hooks (V1 and legacy)"]  # fmt: skip
    lines = [line for line in proc.stdout.splitlines() if line.startswith("[")]
    assert len(lines) == len(checks) and "[FAIL]" not in proc.stdout
    assert all(line.startswith(f"[ok] {check}") for line, check in zip(lines, checks, strict=True)), lines
