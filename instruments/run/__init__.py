"""ONE verl run on CPU: its settings (settings.py), the task and its reward (task.py, reward.py), the models (a
pretrained LM, pretrained.py; the tiny model, tiny.py, the end-to-end tests' fixture), what every run of a work folder
shares (prepare.py), the run itself (verl_run.py: overrides, launch, steps followed, memory held) and its resumption
(resume.py), and the reading of a finished run (report.py, run_logs.py). Imports instruments.cpu and below, never
instruments.compare or instruments.demo (tests/test_layers.py)."""
