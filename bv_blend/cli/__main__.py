"""``python -m bv_blend.cli``: the ``bv-blend`` command, where the console script is not on PATH."""

import sys

from bv_blend.cli import main

sys.exit(main())
