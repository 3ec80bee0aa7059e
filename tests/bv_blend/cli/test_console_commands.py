"""The `bv-blend` command as a pip user gets it: the wheel built from this checkout, installed with
`pip install --no-deps --target` beside the suite's site-packages (its dependencies), and run from a folder where
the checkout cannot be imported. Every command's `--help`, the errors a user meets first, and a real codebook
built from a small parquet file with the packaged MiniLM."""

from __future__ import annotations

import ast
import configparser
import os
import site
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pyarrow.parquet as pq
import pytest

from bv_blend import cli
from bv_blend.codebook import CLUSTER_KEY, Codebook
from tests._scripts import load_script
from tests._wheel import ROOT, build_wheel
from tests.bv_blend.codebook.test_annotate import questions, verl_frame

pytestmark = pytest.mark.slow  # a wheel build, a pip install and a MiniLM load in a fresh interpreter: ~30 s

# What the issue moves out of the package (the labs, the demo, the CPU platform, their statistics and machine
# description): the installed commands must run without them.
INSTRUMENTS = ("instruments",)


@dataclass(frozen=True)
class Installed:
    """The wheel installed into ``target``; commands run in ``cwd``, where no checkout is importable."""

    target: Path
    cwd: Path
    env: dict[str, str]

    @property
    def console_script(self) -> Path:
        return self.target / "bin" / "bv-blend"

    def run(self, *argv: str | Path, timeout: float = 300) -> subprocess.CompletedProcess:
        return subprocess.run([str(a) for a in argv], cwd=self.cwd, env=self.env, capture_output=True, text=True,
                              timeout=timeout)  # fmt: skip

    def command(self, *argv: str | Path) -> subprocess.CompletedProcess:
        """``python -m bv_blend.cli ...`` from the installed copy."""
        return self.run(sys.executable, "-m", "bv_blend.cli", *argv)


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    return build_wheel(tmp_path_factory.mktemp("wheel"))


@pytest.fixture(scope="module")
def installed(wheel, tmp_path_factory) -> Installed:
    work = tmp_path_factory.mktemp("installed")
    target, cwd = work / "site", work / "elsewhere"
    cwd.mkdir()
    pip = [sys.executable, "-m", "pip", "install", "--no-deps", "--no-index", "--quiet", "--target", str(target)]
    subprocess.run([*pip, str(wheel)], capture_output=True, text=True, check=True, timeout=300)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the checkout's path must not leak in
    env["PYTHONPATH"] = os.pathsep.join([str(target), *site.getsitepackages()])
    return Installed(target, cwd, env)


def test_the_wheel_declares_the_console_command(wheel):
    with zipfile.ZipFile(wheel) as archive:
        (name,) = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
        entry_points = configparser.ConfigParser()
        entry_points.read_string(archive.read(name).decode())
    assert entry_points["console_scripts"]["bv-blend"] == "bv_blend.cli:main"


def test_the_commands_run_from_the_installed_copy_not_the_checkout(installed):
    found = installed.run(sys.executable, "-c", "import bv_blend.cli; print(bv_blend.cli.__file__)")
    assert found.returncode == 0, found.stderr
    assert Path(found.stdout.strip()).is_relative_to(installed.target)
    assert not Path(found.stdout.strip()).is_relative_to(ROOT)


def test_the_top_level_help_lists_every_command(installed):
    shown = installed.command("--help")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith("usage: bv-blend") and all(name in shown.stdout for name in cli.COMMANDS)


@pytest.mark.parametrize("name", sorted(cli.COMMANDS))
def test_every_command_has_its_help(installed, name):
    shown = installed.command(name, "--help")
    assert shown.returncode == 0, shown.stderr
    assert shown.stdout.startswith(f"usage: bv-blend {name}")
    assert cli.COMMANDS[name].__doc__.splitlines()[0] in shown.stdout  # its own description, not the top's


def test_pip_wrote_the_console_script_and_it_runs(installed):
    assert installed.console_script.is_file(), sorted(p.name for p in installed.target.iterdir())
    shown = installed.run(installed.console_script, "--help")
    assert shown.returncode == 0, shown.stderr
    assert "codebook" in shown.stdout and "priors" in shown.stdout and "doctor" in shown.stdout


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["codebook", "{missing}", "--out-dir", "out", "-k", "4"], "does not exist"),
        (["codebook", "{data}", "--out-dir", "out", "-k", "0"], "must be a positive integer, got 0"),
        (["codebook", "{data}", "--out-dir", "out", "-k", "500"], "larger than the number of prompts"),
        (["codebook", "{data}", "--out-dir", "out"], "required: -k/--num-clusters"),
        (["priors", "--out", "p.json", "data.train_files=x"], "--config-name is required"),
        (["priors", "--cpu", "--config-name", "bv_blend", "--out", "p.json"], "unrecognized arguments: --cpu"),
        (["train"], "invalid choice: 'train'"),
    ],
)
def test_bad_input_is_one_line_and_a_nonzero_exit(installed, small_parquet, argv, message):
    """Named problem, named fix, exit code 2, no traceback; nothing written."""
    argv = [a.format(missing=installed.cwd / "missing.parquet", data=small_parquet) for a in argv]
    failed = installed.command(*argv)
    assert failed.returncode == 2, failed.stdout + failed.stderr
    assert message in failed.stderr and "Traceback" not in failed.stderr
    assert not (installed.cwd / "out").exists()


# A base install (`pip install bv-blend`, no extra) lacks the codebook's packages; and no command's --help (nor the
# dispatch to a command) should need to import verl, which takes seconds. These imports now fail.
HIDDEN = ("pyarrow", "sentence_transformers", "sklearn", "verl")
WITHOUT_EXTRAS = f"import sys; sys.modules.update(dict.fromkeys({HIDDEN!r}))"


def test_help_needs_no_extra_and_a_build_without_one_names_the_extra(installed, small_parquet):
    run = f"{WITHOUT_EXTRAS}; from bv_blend.cli import main; sys.exit(main(sys.argv[1:]))"
    shown = installed.run(sys.executable, "-c", run, "codebook", "--help")
    assert shown.returncode == 0 and "--num-clusters" in shown.stdout, shown.stderr
    failed = installed.run(sys.executable, "-c", run, "codebook", small_parquet, "-k", "2", "--out-dir", "out")
    assert failed.returncode == 2 and "Traceback" not in failed.stderr, failed.stderr
    assert "pip install 'bv-blend[codebook]'" in failed.stderr


@pytest.fixture(scope="module")
def small_parquet(tmp_path_factory) -> Path:
    """27 prompts in verl's gsm8k format, three topics."""
    path = tmp_path_factory.mktemp("data") / "train.parquet"
    verl_frame(questions(0) + questions(1) + questions(2)).to_parquet(path, index=False)
    return path


def test_the_installed_command_builds_a_codebook_and_annotates_the_parquet(installed, small_parquet, tmp_path):
    out = tmp_path / "k3"
    built = installed.run(installed.console_script, "codebook", small_parquet, "--num-clusters", "3",
                          "--out-dir", out, "--cache-dir", tmp_path / "cache")  # fmt: skip
    assert built.returncode == 0, built.stdout + built.stderr
    book = Codebook.load(out / "codebook.npz")
    assert book.num_clusters == 3 and book.train_count == 27 and book.dim == 384  # MiniLM's width
    annotated = pq.read_table(out / "train.parquet").column("extra_info").combine_chunks()
    ids = annotated.field(CLUSTER_KEY).to_pylist()
    assert len(ids) == 27 and set(ids) <= {0, 1, 2} and len(set(ids)) > 1
    assert (out / "report.md").is_file() and f"codebook: {out / 'codebook.npz'}" in built.stdout
    assert "encoding" in built.stderr and "[codebook] fitting kmeans with K=3" in built.stderr  # the long steps


def test_the_commands_import_no_instrument():
    """The installed commands run without the repository's instruments (the CPU harness stays in scripts/), lazy
    imports inside functions included."""
    imported = set()
    for path in (ROOT / "bv_blend" / "cli").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Import):
                imported |= {alias.name for alias in node.names}
            elif isinstance(node, ast.ImportFrom) and node.module:
                imported |= {node.module, *(f"{node.module}.{alias.name}" for alias in node.names)}
    assert "bv_blend.verl.offline_priors" in imported  # the scan sees the lazy imports
    assert not {name for name in imported if name.startswith(INSTRUMENTS)}


def test_the_priors_script_is_the_command_plus_the_cpu_options():
    """One definition of the arguments: the repository's face adds only what needs its CPU harness."""
    def options(parser) -> set[str]:
        return {option for action in parser._actions for option in action.option_strings}

    command = options(cli.build_parser()[1]["priors"])
    script = options(load_script("offline_priors").build_parser())
    assert command < script and script - command == {"--cpu", "--timeout-s"}
