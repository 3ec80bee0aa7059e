"""Many verl runs on CPU, compared: the arms and their grid (arms.py), each run's bookkeeping and result (runs.py),
the pairing of an arm with the reference (pairing.py), the report into results/benchmarks.md (report.py), the
no-revisit regime's summary (no_revisit.py), the arms' mechanisms (mechanisms.py), the rules that fix a comparison's
settings (selection.py) and a comparison's state in the repository (state.py). scripts/compare_cpu.py runs it; it
imports instruments.run and below, never instruments.demo (tests/test_layers.py)."""
