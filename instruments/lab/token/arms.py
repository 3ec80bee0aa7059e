"""The arms the token-level lab compares: data, one declaration per arm.

An arm is a verl advantage estimator (its name in verl's registry and the options merged into verl's
``config.algorithm``), a group size n (rollouts per prompt; prompts per step = the suite's budget / n) and whether
the prompt sampler picks each step's prompts. Every arm of a suite spends the same number of rollouts a step.

An arm that this installation cannot run (an estimator that is not registered in verl, options it rejects, or the
prompt sampler that is not there yet) is reported as unavailable with the reason, and the suite runs the others.
Whether it can run is found by calling it: :func:`unavailable_reason` sends a two-prompt batch through the same
face the runs use, so a rejected option fails here, with verl's or BV-Blend's own message.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import torch

from bv_blend.verl import offline
from instruments import regime as shared_regime

# BV-Blend's history levels that key the history by prompt, and so need a key per row (bv_blend.verl.offline's
# ``prompt_keys``); ``spo`` keeps a per-prompt value estimate and needs it too.
PROMPT_HISTORY_LEVELS = ("prompt", "prompt_and_cluster")
NEEDS_PROMPT_KEYS = frozenset({"spo"})
PRIOR_OPTION = {"spo": ("spo", "offline_values"), "bv_blend": ("bv_blend", "prior_file")}  # history_spec 4
ORACLE_BASELINE = "oracle_baseline"  # not a verl estimator: the run computes R - p itself (run.py)


@dataclass(frozen=True)
class TokenArm:
    key: str  # names its result files: changing what an arm is means giving it a new key
    label: str
    adv_estimator: str
    options: Mapping[str, Any] = field(default_factory=dict, hash=False)
    n: int = 8
    sampler: bool = False  # each step's prompts drawn by the prompt sampler instead of in shuffled order
    # A derived arm: after the comparison's other runs, it takes the estimator and options of the best of these
    # arms (highest seed-mean final held-out pass rate; runner.resolve_derived), with its own n and sampler.
    best_of: tuple[str, ...] = ()
    # A limit of the no-revisit regime (results/regime.md, addendum): "baseline" (the advantage R - p^, p^ estimated
    # from 8 extra samples) or "allocation" (the step's rollouts split by p^, Knapsack-style, then this estimator).
    oracle: str = ""
    priors: bool = False  # reads the suite's offline priors (SPO's offline_values, BV-Blend's prior_file)
    # An arm fixed in place (its key is the regime's, instruments/regime.ARMS): runs stored by an earlier revision
    # are stale, and a rerun of the suite's command runs them again (store.Store.load).
    revision: int = 0

    @property
    def needs_prompt_keys(self) -> bool:
        if self.priors or self.adv_estimator in NEEDS_PROMPT_KEYS:
            return True
        level = dict(self.options.get("bv_blend", {})).get("history_level")
        return self.adv_estimator == "bv_blend" and level in PROMPT_HISTORY_LEVELS

    def prompts_per_step(self, budget: int) -> int:
        return budget // self.n

    def algorithm_options(self, num_clusters: int, priors: str | None = None) -> dict[str, Any]:
        """The options for one run; BV-Blend also gets K (``algorithm.bv_blend.num_clusters``), and an arm with
        priors the path of the suite's prior file (``priors``; the probe runs without it)."""
        options = {key: dict(value) if isinstance(value, Mapping) else value for key, value in self.options.items()}
        if self.adv_estimator == "bv_blend":
            options["bv_blend"] = {**options.get("bv_blend", {}), "num_clusters": num_clusters}
        if self.priors and priors is not None:
            section, option = PRIOR_OPTION[self.adv_estimator]
            options[section] = {**options.get(section, {}), option: priors}
        return options

    def resolved(self, winner: TokenArm) -> TokenArm:
        """A derived arm with the estimator and options of ``winner``."""
        return replace(self, adv_estimator=winner.adv_estimator, options=dict(winner.options),
                       best_of=())

    def describe(self) -> dict[str, Any]:
        """What determines this arm's runs, and its label (stored in each result file, compared on resume but for
        the label: renaming an arm does not change its runs)."""
        return {"label": self.label, "adv_estimator": self.adv_estimator, "options": _plain(self.options),
                "n": self.n, "sampler": self.sampler, "best_of": list(self.best_of),
                **({"oracle": self.oracle} if self.oracle else {}), **({"priors": True} if self.priors else {}),
                **({"revision": self.revision} if self.revision else {})}

    def supersedes(self, described: Mapping[str, Any]) -> bool:
        """Whether ``described`` (a stored run's arm) is this arm at an earlier revision: the same in all else but
        the label."""
        old = {key: value for key, value in described.items() if key != "label"}
        revision = old.pop("revision", 0)
        mine = {key: value for key, value in self.describe().items() if key not in ("label", "revision")}
        return isinstance(revision, int) and revision < self.revision and old == mine


def bv_blend(key: str, label: str, n: int, sampler: bool = False, **options: Any) -> TokenArm:
    return TokenArm(key, label, "bv_blend", {"bv_blend": options}, n=n, sampler=sampler)


REFERENCE = "grpo8"
ARMS: dict[str, TokenArm] = {arm.key: arm for arm in (
    TokenArm("grpo8", "GRPO n=8", "grpo", n=8),  # the reference: the paper's shape
    TokenArm("grpo2", "GRPO n=2", "grpo", n=2),
    bv_blend("bv8", "BV-Blend n=8 (defaults)", n=8),  # the paper's shape, with its defaults
    bv_blend("bv2", "BV-Blend n=2 (cluster history)", n=2),
    bv_blend("bv2_prompt", "BV-Blend n=2, history_level=prompt_and_cluster", n=2, history_level="prompt_and_cluster"),
    TokenArm("spo1", "SPO n=1", "spo", n=1),
    TokenArm("spo1_sampler", "SPO n=1 + sampler", "spo", n=1, sampler=True),
    TokenArm("bv2_best_sampler", "best BV-Blend n=2 + sampler", "bv_blend", n=2, sampler=True,
             best_of=("bv2", "bv2_prompt")),
    TokenArm("rpp1", "REINFORCE++ n=1 (batch baseline)", "reinforce_plus_plus", n=1),  # optional in the issue
)}

# The no-revisit regime's arms (issue 29), keyed as instruments/regime.ARMS declares them for every instrument.
REGIME_ARMS: dict[str, TokenArm] = {arm.key: arm for arm in (
    TokenArm("grpo8", "GRPO n=8", "grpo", n=8),
    TokenArm("grpo2", "GRPO n=2", "grpo", n=2),
    TokenArm("rpp1", "REINFORCE++ n=1", "reinforce_plus_plus", n=1),
    bv_blend("bv_cluster1", "BV-Blend cluster level n=1", n=1),
    bv_blend("bv_cluster2", "BV-Blend cluster level n=2", n=2),
    bv_blend("bv_cluster8", "BV-Blend cluster level n=8", n=8),
    TokenArm("spo1", "SPO n=1", "spo", n=1),
    TokenArm("spo1_priors", "SPO n=1 + offline priors", "spo", n=1, priors=True),
    # revision 1 (issue 37): its prior file acts; revision 0 ran without it, bit-identical to bv_cluster2
    TokenArm("bv2_priors", "BV-Blend prompt_and_cluster n=2 + offline priors", "bv_blend",
             {"bv_blend": {"history_level": "prompt_and_cluster"}}, n=2, priors=True, revision=1),
    # The limits' p is an estimate from 8 extra samples of the current policy (run.estimated_success), not the true
    # p: their labels say so (instruments/regime.ARMS names it for each lab).
    TokenArm("oracle_baseline1", "limit: baseline R - p^, p^ from 8 samples, n=1", ORACLE_BASELINE, n=1,
             oracle="baseline"),
    TokenArm("knapsack_grpo2", "limit: Knapsack allocation by 8-sample estimated p + GRPO (32 prompts)", "grpo", n=2,
             oracle="allocation"),
)}

PRIORS_TWINS = shared_regime.PRIORS_TWINS  # each priors arm's twin without priors, declared with the arm

ARM_TABLES = {"comparison": ARMS, "regime": REGIME_ARMS}  # a suite's arms come from one of these


def unavailable_reason(arm: TokenArm, num_clusters: int = 5) -> str | None:
    """Why this installation cannot run ``arm``, or None when it can (a derived arm: see :func:`derived_reason`)."""
    if arm.best_of:
        return derived_reason(arm, num_clusters)
    if arm.oracle == "baseline":
        return None  # computed by the run itself
    name = arm.adv_estimator
    if name not in offline.registered_estimators():
        return f"verl has no advantage estimator {name!r} registered in this installation"
    return _probe(arm, num_clusters)


def derived_reason(arm: TokenArm, num_clusters: int) -> str | None:
    """A derived arm runs when all of its candidates do."""
    missing = [key for key in arm.best_of if unavailable_reason(ARMS[key], num_clusters) is not None]
    return f"it takes the best of {list(arm.best_of)}, and {missing} cannot run yet" if missing else None


def _probe(arm: TokenArm, num_clusters: int) -> str | None:
    """Send two prompts x n rows through bv_blend.verl.offline exactly as a run does; the error, if any."""
    from instruments.lab.token.advantages import TokenAdvantages

    rows = 2 * arm.n
    scores = torch.tensor([float(i % 2 == 0) for i in range(rows)])
    mask = torch.ones(rows, 3, dtype=torch.int64)
    uids = np.repeat(np.array(["probe-0", "probe-1"], dtype=object), arm.n)
    keys = np.repeat(np.array(["probe question 0", "probe question 1"]), arm.n)
    try:
        advantages = TokenAdvantages(arm, num_clusters)(scores, mask, uids, np.repeat([0, 1], arm.n), keys)
        if advantages.shape != mask.shape:
            return f"its advantages have shape {tuple(advantages.shape)} for a batch of shape {tuple(mask.shape)}"
    # Any error here means "this installation cannot run the arm"; the reason is reported, not raised.
    except Exception as error:  # noqa: BLE001
        return f"its call through bv_blend.verl.offline fails: {type(error).__name__}: {_first_sentence(error)}"
    finally:
        offline.reset_history(arm.adv_estimator)
    return None


def _first_sentence(error: Exception) -> str:
    return str(error).split(". ")[0].strip().rstrip(".")


def _plain(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value
