"""The part of the report that explains the lab: how to run it, what each suite costs, and the choices behind the
pool, the evaluation and the statistics. Numbers come from the suite's settings and the frozen selection."""

from __future__ import annotations

from instruments.lab.token.arms import ARMS
from instruments.lab.token.suites import LR_SWEEP_FACTORS, Suite, full, quick, select


def guide(suite: Suite, frozen: dict | None) -> list[str]:
    lines = ["## How to run it", "",
             "    python scripts/lab_token.py --suite quick --out /tmp/lab_token             # smoke check",
             "    python scripts/lab_token.py --suite full --out runs/lab_token --jobs 2     # results/token_lab/lab_token.md",
             "    python scripts/lab_token.py --suite full --out runs/lab_token --lr-sweep   # + lr x0.5 and x2",
             "    python scripts/lab_token.py --suite full --out runs/lab_token --report-only",
             "",
             "Unattended and resumable: each (arm, seed, learning rate) run writes its result file atomically when "
             "it finishes (DIR/runs), a restarted suite skips the finished runs, a run that raises is kept in "
             "DIR/failed with its error and retried by the next start, and a folder made with other settings is "
             "refused. Workers are fresh processes, torch single-threaded; the warmed-up model is made once per "
             "folder (DIR/warmup) and loaded by every run. An arm whose estimator is not registered, or whose "
             "options or extra arguments the shipped code rejects, is listed as unavailable with the reason "
             "(found by sending a two-prompt batch through the same call the runs make) and the others run; "
             "once that code lands, rerunning the same command runs just those arms.", ""]
    lines += _suites(frozen) + _pool(suite) + _evaluation(suite, frozen)
    return lines


def _suites(frozen: dict | None) -> list[str]:
    rows = [("select", select()), ("quick", quick(frozen or {"lr": 1e-4}))]
    if frozen is not None:
        rows.append(("full", full(frozen)))
    lines = ["### The suites", "",
             "| suite | arms | seeds | steps | held-out evaluation | runs | purpose |", "|---|---|---|---|---|---|---|"]
    purpose = {"select": "point 3: learning rate and step count, on GRPO n=8 alone (done once, below)",
               "quick": "smoke check (its own report's header gives the last command's measured wall time)",
               "full": "the comparison (results/token_lab/lab_token.md)"}
    for name, s in rows:
        st = s.settings
        runs = len(s.arms) * len(s.seeds) * len(s.lrs)
        lines.append(f"| {name} | {len(s.arms)} | {s.seeds[0]}-{s.seeds[-1]} | {st.steps} | {st.val_prompts} x "
                     f"{st.eval_samples} every {st.eval_every} steps | {runs} (with every arm available) | "
                     f"{purpose[name]} |")
    seeds = len(full(frozen).seeds) if frozen is not None else 10
    lines += ["", f"`--lr-sweep [ARM]` adds, after the comparison, the reference and ARM (by default the arm that "
              f"comes out best, by selection.py's rule) at x{LR_SWEEP_FACTORS[0]:g} and x{LR_SWEEP_FACTORS[1]:g} "
              f"the frozen learning rate on the comparison's seeds: {2 * 2 * seeds} more runs.", ""]
    return lines + (_time(frozen, seeds) if frozen is not None else [])


def _time(frozen: dict, seeds: int) -> list[str]:
    """The full suite's projected wall time on 2 idle cores, from the selection's measured cost."""
    sel, costs = frozen["selection"], _costs(frozen)
    if costs is None:
        return []
    per_step, per_eval = costs
    cpu, wall, share = sel["cpu_seconds_per_run"], sel["wall_seconds_per_run"], sel["eval_seconds_per_run"] / sel[
        "wall_seconds_per_run"]
    settings = full(frozen).settings
    per_run = settings.steps * per_step + len(settings.eval_steps()) * per_eval
    runs = len(ARMS) * seeds
    evaluations = sel["steps"] // sel["eval_every"] + 1
    return [f"**Time.** In the selection a run of GRPO n=8 ({sel['steps']} steps, {evaluations} evaluations) cost "
            f"{cpu:.0f} s of CPU ({wall:.0f} s wall on a machine shared with other jobs), "
            f"{share:.0%} of it evaluating: {per_step:.2f} s a training step and {per_eval:.2f} s an evaluation. "
            f"A full-suite run ({settings.steps} steps, {len(settings.eval_steps())} evaluations) then costs "
            f"{per_run:.0f} s, and the {runs} runs ({len(ARMS)} arms x {seeds} seeds; an unavailable arm's runs drop "
            f"out) take {per_run:.0f} s x {runs} / 2 workers = **{per_run * runs / 2 / 60:.0f} min** on 2 idle cores "
            f"(+ 1 min of warm-up); `--lr-sweep` adds {per_run * 4 * seeds / 2 / 60:.0f} min. On a machine shared "
            "with other jobs, expect several times more (runs of the selection took up to 5x their CPU time in "
            "wall time). Arms with n = 1 or 2 cost about as much a step as n = 8 (64 responses are sampled and "
            "trained on either way).", ""]


def _pool(suite: Suite) -> list[str]:
    s = suite.settings
    lines = ["### The training pool, and how often a prompt comes back", "",
             f"Every arm draws from the same fixed pool of {s.pool_size} training problems ({s.pool_size // 5} per "
             "family, disjoint from the held-out split; tiny_sum has only 26 prompts outside the demo's split, so "
             "its places repeat them, as the demo's training data does). Without the sampler a run walks the pool "
             f"in shuffled epochs (pool.py), so at {s.budget} rollouts a step over {s.steps} steps a prompt is "
             "trained on:", "",
             "| n | prompts a step | epochs (visits per prompt) over the run |", "|---|---|---|"]
    for n in sorted({arm.n for arm in ARMS.values()}, reverse=True):
        k = s.budget // n
        lines.append(f"| {n} | {k} | {s.steps * k / s.pool_size:.1f} |")
    lines += ["", "A prompt-level history (spo, BV-Blend's `history_level=prompt*`) needs those revisits; the "
              "sampler's arms report their measured visits in the arm table.", ""]
    return lines


def _evaluation(suite: Suite, frozen: dict | None) -> list[str]:
    s = suite.settings
    responses, seeds = s.val_prompts * s.eval_samples, len(suite.seeds)
    cost = ""
    if frozen is not None and (costs := _costs(frozen)) is not None:
        per_step, per_eval = costs
        share = len(s.eval_steps()) * per_eval / (s.steps * per_step + len(s.eval_steps()) * per_eval)
        cost = (f" An evaluation costs {per_eval:.1f} s of CPU, as much as {per_eval / per_step:.0f} training steps "
                f"of {s.budget} rollouts; at these settings evaluating is {share:.0%} of a run.")
    return ["### The held-out evaluation", "",
            f"The demo's {s.val_prompts} held-out prompts, {s.eval_samples} responses each at T=1, scored by the "
            f"verifier: {responses} responses an evaluation, at step 0 and every {s.eval_every} steps "
            f"({len(s.eval_steps())} a run).{cost} The interval is what the rollouts-to-reach reading needs (a "
            f"crossing is interpolated between evaluations {s.eval_every / s.steps:.0%} of the run apart); "
            f"{s.eval_samples} samples put the binomial error of one evaluation near "
            f"{(0.24 / responses) ** 0.5:.3f} at a pass rate of 0.4, which the {seeds} seeds average down. "
            "Evaluations draw their own random numbers, the same for every arm of a seed at a step (run.py): the "
            "paired differences lose that part of the noise, and how often a run is evaluated does not change its "
            "training.", ""]


def _costs(frozen: dict) -> tuple[float, float] | None:
    """CPU seconds per training step and per evaluation, from the selection's runs (their wall-time shares)."""
    sel = frozen["selection"]
    cpu, wall = sel.get("cpu_seconds_per_run"), sel.get("wall_seconds_per_run")
    if not cpu or not wall:
        return None
    share = sel.get("eval_seconds_per_run", 0.0) / wall
    return cpu * (1 - share) / sel["steps"], cpu * share / (sel["steps"] // sel["eval_every"] + 1)
