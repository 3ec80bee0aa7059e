"""``python -m bv_blend.verl.cpu_launch``: the CPU launcher's former path, kept for existing commands.

The launcher is :mod:`bv_blend.verl.cpu.launch`.
"""

import sys

from bv_blend.verl.cpu.launch import main, run_trainer, trainer_command, verl_rule_score

__all__ = ["main", "run_trainer", "trainer_command", "verl_rule_score"]

if __name__ == "__main__":
    sys.exit(main())
