"""The project's instruments: what measures and exercises the plugin, beside it in the repository and not shipped.

Not part of the ``bv-blend`` wheel (pyproject.toml packages only ``bv_blend`` and ``hydra_plugins``): a pip user gets
the plugin; a checkout also gets these.

- :mod:`instruments.lab`: the logistic lab (simulated RLVR);
- :mod:`instruments.demo`: the CPU main job, on :mod:`instruments.compare` (many runs compared: the multi-seed
  comparison harness) on :mod:`instruments.run` (one verl run on CPU);
- :mod:`instruments.cpu`: the CPU platform that runs verl's stock trainer without a GPU (the harness of every run and
  of the end-to-end tests);
- :mod:`instruments.stats` and :mod:`instruments.machine`: their statistics over seeds and their machine description.

They may import the plugin (``bv_blend``); the plugin never imports them (tests/test_layers.py). A checkout makes
them importable by having its root on ``sys.path``: pytest does (``pythonpath``), ``scripts/setup_env.sh`` writes a
``.pth`` file for the venv, and :func:`instruments.cpu.cpu_env` puts the root on ``PYTHONPATH`` for verl's
subprocesses.
"""
