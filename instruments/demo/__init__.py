"""The CPU demo, the main job: GRPO vs BV-Blend (and, with --recommended, the README's setting) on a pretrained LM with
verl's stock trainer (pipeline.py), from one shared start, in tables, a plot and a summary (report.py). Entry point:
scripts/demo_cpu.py (docs/cpu.md). It sits on top: instruments.compare for the recommended arm, instruments.run for
each run."""
