"""A suite's output folder: one result file per finished (arm, seed, lr) run, so that a suite resumes.

    DIR/manifest.json              the suite's name and settings; a folder made with other settings is refused
    DIR/runs/<arm>__s<seed>__lr<lr>.json   one finished run: what the arm was, and its RunRecord
    DIR/failed/<same name>.json    a run that raised, with the error (not finished: a restart tries it again)
    DIR/warmup/                    the warmed-up model, made once and shared by every run

Every file is written to a temporary name and renamed into place, so an interruption leaves either the whole
file or none of it.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict
from pathlib import Path
from typing import Any

from instruments.lab.token.arms import TokenArm
from instruments.lab.token.run import LabSettings, RunRecord

MANIFEST = "manifest.json"
FORMAT = 1  # of the files here; bumped when their meaning changes


class SettingsMismatch(ValueError):
    """The output folder holds runs made with other settings."""


def write_json(path: Path, data: Any) -> None:
    """Write ``data`` to ``path`` atomically (temporary file in the same folder, then rename)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    with open(tmp, "w") as handle:
        json.dump(data, handle, indent=1)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


def run_name(arm_key: str, seed: int, lr: float) -> str:
    return f"{arm_key}__s{seed}__lr{lr:.6g}.json"


class Store:
    def __init__(self, out: Path) -> None:
        self.out = Path(out)
        self.runs = self.out / "runs"
        self.failed = self.out / "failed"
        self.cache = self.out / "warmup"

    def manifest(self, suite: str, settings: LabSettings) -> dict[str, Any]:
        return {"format": FORMAT, "suite": suite, "settings": asdict(settings)}

    def open(self, suite: str, settings: LabSettings) -> None:
        """Claim the folder for this suite, or raise SettingsMismatch if it holds another's runs."""
        wanted = self.manifest(suite, settings)
        path = self.out / MANIFEST
        if path.is_file():
            found = json.loads(path.read_text())
            if found != wanted:
                raise SettingsMismatch(f"{self.out} holds runs of other settings; use another --out, or delete it "
                                       f"to start again. Differences (found, wanted): {_differences(found, wanted)}")
            return
        if self.runs.is_dir() and any(self.runs.iterdir()):
            raise SettingsMismatch(f"{self.runs} holds runs but {path} is missing: cannot tell their settings")
        write_json(path, wanted)

    def read_manifest(self) -> dict[str, Any] | None:
        path = self.out / MANIFEST
        return json.loads(path.read_text()) if path.is_file() else None

    def load(self, arm: TokenArm, seed: int, lr: float) -> RunRecord | None:
        """The finished run, or None (also for a run of an earlier revision of the arm, which is run again and
        overwritten); raises SettingsMismatch if the file was made by another arm of that key."""
        path = self.runs / run_name(arm.key, seed, lr)
        if not path.is_file():
            return None
        data = json.loads(path.read_text())
        if arm.supersedes(data["arm"]):
            return None
        if _unlabelled(data["arm"]) != _unlabelled(arm.describe()):
            raise SettingsMismatch(f"{path} was made by arm {data['arm']}, not {arm.describe()}: the arm's "
                                   "definition changed; give the changed arm a new key, or delete the file")
        return RunRecord.from_dict(data["record"])

    def save(self, arm: TokenArm, record: RunRecord) -> Path:
        path = self.runs / run_name(arm.key, record.seed, record.lr)
        write_json(path, {"arm": arm.describe(), "record": record.to_dict()})
        failed = self.failed / path.name
        if failed.is_file():
            failed.unlink()
        return path

    def save_failure(self, arm: TokenArm, seed: int, lr: float, error: str) -> None:
        write_json(self.failed / run_name(arm.key, seed, lr), {"arm": arm.describe(), "error": error})

    def failures(self) -> dict[str, str]:
        if not self.failed.is_dir():
            return {}
        return {p.name: json.loads(p.read_text())["error"] for p in sorted(self.failed.glob("*.json"))}


def _unlabelled(described: dict[str, Any]) -> dict[str, Any]:
    """An arm's description without its label: a label names the runs, it does not make them."""
    return {key: value for key, value in described.items() if key != "label"}


def _differences(found: dict[str, Any], wanted: dict[str, Any], prefix: str = "") -> dict[str, tuple[Any, Any]]:
    out: dict[str, tuple[Any, Any]] = {}
    for key in sorted(set(found) | set(wanted)):
        a, b = found.get(key), wanted.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out.update(_differences(a, b, f"{prefix}{key}."))
        elif a != b:
            out[prefix + key] = (a, b)
    return out
