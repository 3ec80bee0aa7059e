"""``bv-blend``: the offline steps of a BV-Blend run, installed with the package (``[project.scripts]``).

    bv-blend codebook ~/data/train.parquet --num-clusters 64 --out-dir ~/data/k64   # cluster + annotate, once
    bv-blend priors --config-name NAME --samples 8 --out priors.json data.train_files=... ...   # optional warm start
    bv-blend doctor                                                                  # does verl load the plugin?

Training itself is verl's own entry point: ``python -m verl.trainer.main_ppo --config-name bv_blend ...``.
Each subcommand is one small module with ``SUMMARY``, ``add_arguments``, ``parse`` and ``run``; they import the
library they call only when they run, so ``--help`` needs neither verl's trainer nor the codebook extra.
"""

from __future__ import annotations

import argparse
import sys
from types import ModuleType

from bv_blend.cli import codebook, doctor, priors
from bv_blend.cli.errors import CommandError, run_guarded

PROG = "bv-blend"
DESCRIPTION = """BV-Blend for verl 0.9.1: the offline steps of a run.

  bv-blend codebook train.parquet --num-clusters 64 --out-dir k64    # once: cluster and annotate the prompts
  python -m verl.trainer.main_ppo --config-name bv_blend \\
      data.train_files=k64/train.parquet algorithm.bv_blend.codebook_path=k64/codebook.npz ...   # then train
"""
COMMANDS: dict[str, ModuleType] = {"codebook": codebook, "priors": priors, "doctor": doctor}


def _version() -> str:
    from bv_blend.verl.versions import installed_version

    return installed_version("bv-blend") or "not installed (run from a checkout)"


def build_parser() -> tuple[argparse.ArgumentParser, dict[str, argparse.ArgumentParser]]:
    """The ``bv-blend`` parser and each subcommand's own parser (``bv-blend <command> --help``)."""
    parser = argparse.ArgumentParser(
        prog=PROG, description=DESCRIPTION, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="`bv-blend <command> --help` gives a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}")
    commands = parser.add_subparsers(title="commands", dest="command", metavar="<command>", required=True)
    parsers = {}
    for name, module in COMMANDS.items():
        sub = commands.add_parser(name, help=module.SUMMARY, description=module.__doc__,
                                  formatter_class=argparse.RawDescriptionHelpFormatter)
        module.add_arguments(sub)
        parsers[name] = sub
    return parser, parsers


def main(argv: list[str] | None = None) -> int:
    """The console command: dispatch to the subcommand, return its exit code."""
    argv = list(sys.argv[1:] if argv is None else argv)
    parser, parsers = build_parser()
    if not argv or argv[0] not in COMMANDS:
        parser.parse_args(argv)  # --help, --version, or a usage error naming the commands (exits)
        return 2
    # Each subcommand parses its own arguments: `priors` interleaves hydra overrides with its options, which
    # argparse's intermixed parsing allows for a plain parser but not through subparsers.
    name, module = argv[0], COMMANDS[argv[0]]
    prog = parsers[name].prog
    return run_guarded(prog, lambda: module.run(module.parse(parsers[name], argv[1:])))


__all__ = ["COMMANDS", "CommandError", "build_parser", "main"]
