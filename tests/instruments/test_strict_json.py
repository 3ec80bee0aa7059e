"""Every JSON file the repository holds is strict JSON (no NaN or Infinity), and the instruments write it so."""

from __future__ import annotations

import json
import math
import subprocess
from pathlib import Path

import pytest

from instruments.strict_json import finite_or, strict_dumps

ROOT = Path(__file__).resolve().parents[2]


def _refuse(constant: str) -> None:
    raise ValueError(f"{constant} is not JSON")


def test_every_committed_json_file_is_strict():
    files = subprocess.run(["git", "ls-files", "*.json"], cwd=ROOT, capture_output=True, text=True,
                           check=True).stdout.split()
    assert len(files) > 50  # the run record's results and summaries are there
    loose = []
    for name in files:
        try:
            json.loads((ROOT / name).read_text(), parse_constant=_refuse)
        except ValueError as e:
            loose.append(f"{name}: {e}")
    assert loose == []


def test_a_figure_that_is_not_finite_is_written_as_null_and_read_back_by_its_meaning():
    text = strict_dumps({"signal ratio": math.nan, "reach": [1.0, math.inf, -math.inf], "n": 3})
    data = json.loads(text, parse_constant=_refuse)
    assert data == {"signal ratio": None, "reach": [1.0, None, None], "n": 3}
    assert finite_or(data["reach"][1], math.inf) == math.inf and finite_or(2, math.inf) == 2.0
    assert math.isnan(finite_or(data["signal ratio"], math.nan))


def test_the_check_refuses_what_pythons_json_writes_by_default():
    with pytest.raises(ValueError, match="NaN is not JSON"):
        json.loads(json.dumps({"x": math.nan}), parse_constant=_refuse)
