"""bv-blend doctor: check that verl, in this Python, loads the plugin (the entry point, the registrations, the
trainer hooks), each check in a fresh interpreter. Run it with the Python and environment of the run; exit code 0
when every check passes. docs/verl_integration.md, "Unknown advantage estimator simply: bv_blend"."""

from __future__ import annotations

import argparse

SUMMARY = "check that verl in this Python loads the plugin (run it when verl says 'Unknown advantage estimator')"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """None: the doctor checks the environment it runs in."""


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    return parser.parse_args(argv)


def run(args: argparse.Namespace) -> int:
    from bv_blend.verl.doctor import print_checks

    return print_checks()
