"""The CPU demo: a tiny model warmed up on synthetic arithmetic, trained with verl's stock trainer (GRPO vs
BV-Blend) through the CPU platform in instruments.cpu. Entry point: scripts/demo_cpu.py (docs/cpu.md)."""
