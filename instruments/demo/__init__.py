"""The CPU demo, the main job: one verl run of BV-Blend's cluster level at n = 2, the package's best arm in the
committed pretrained-LM comparison, at that comparison's settings (pipeline.py), read for what one run can tell and set
beside the comparison's five-seed result (report.py). Entry point: scripts/demo_cpu.py (docs/cpu.md). It sits on top:
instruments.compare for the arm, instruments.run for the run."""
