"""The history-driven prompt sampler in verl's trainers (history_spec 5), options ``data.history_sampler.*``.

verl 0.9.1 builds the training sampler in ``verl.trainer.ppo.utils.create_rl_sampler`` (random or sequential), which
both trainers import by name; it has no plugin point. With ``data.history_sampler.enable=true`` the glue's
:func:`create_rl_sampler` returns a :class:`HistorySampler` instead; every other run keeps verl's sampler.

Each batch is ``train_batch_size`` distinct prompts drawn from the whole training set with probability proportional to
``sqrt(p^ (1 - p^)) + epsilon`` (``bv_blend.history.sampler``), where p^ comes from the history of the run's estimator,
read when the batch is drawn: the method of the estimator that its record names (``success_estimates``: SPO's
tracker; BV-Blend's prompt mean, else its cluster's mean, else the prior file's, else 0.5). Each batch's metrics wait
in the sampler until the trainer hooks move them into the channel of the step that trains on it. An epoch is
``len(dataset) // train_batch_size`` batches.

With ``data.history_sampler.epoch_without_replacement=true`` each batch is drawn, by the same weights, from the prompts
not yet drawn in the epoch: every prompt is used at most once an epoch and the weights choose the order (and, in a run
shorter than an epoch, which prompts are used at all). The epoch keeps verl's length, so its last
``len(dataset) % train_batch_size`` prompts (those the weights left to the end) are not drawn in it, as verl's
``drop_last`` leaves out its permutation's tail; the next epoch starts with every prompt available again.

The draws are a function of ``data.seed`` and the history. With ``data.seed=null`` the sampler does what verl's own
does: verl's unseeded ``torch.Generator`` starts from torch's fixed default seed, so every unseeded run draws the same
order; the sampler takes that seed (:data:`UNSEEDED`) and says so in the log.

State: the RNG, the batches drawn in the epoch and, with the epoch option, the prompts drawn in it, saved by verl's
``StatefulDataLoader`` with every checkpoint (``data.pt``); the history is restored by our ``_load_checkpoint`` hook
before the next batch is drawn, so a resumed run draws exactly the batches an uninterrupted run draws. Dataloader
workers would prefetch (draw batches ahead with older weights, and draw them again otherwise after a resume), so the
sampler needs ``data.dataloader_num_workers=0``.
"""

from __future__ import annotations

import logging
import os
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from bv_blend.core.options import OptionsMixin, check_bool, check_number, require
from bv_blend.history import sampler as weights
from bv_blend.history.keys import prompt_key
from bv_blend.verl import runtime
from bv_blend.verl.options import config_get, section_options
from bv_blend.verl.records import RECORDS, record_for
from bv_blend.verl.training_data import dataset_columns

logger = logging.getLogger(__name__)

SECTION = "data.history_sampler"
# data.seed=null: verl's create_rl_sampler then shuffles with an unseeded torch.Generator, whose seed is this fixed
# default (so verl's unseeded runs all draw one order); the history sampler draws from the same seed.
UNSEEDED = torch.Generator().initial_seed()
# Why the sampler cannot serve a dataloader that fetches single prompts (verl's data.gen_batch_size=1).
ONE_AT_A_TIME = ("the sampler would draw each prompt on its own, so a batch could repeat a prompt and every fetch "
                 "would queue metrics for one step")  # fmt: skip


@dataclass(frozen=True)
class SamplerOptions(OptionsMixin):
    """``data.history_sampler.*``.

    Attributes:
        enable: draw each training batch by the history's weights (off: verl's random sampler).
        epsilon: the weight every prompt gets on top of sqrt(p^ (1 - p^)), so that solved and unsolved prompts still
            come back (SPO's ``EXPLORATION_EPSILON``, 0.05).
        epoch_without_replacement: draw each batch from the prompts not yet drawn in this epoch, so that no prompt
            comes back within an epoch (off: each batch from the whole training set).
    """

    SECTION = SECTION

    enable: bool = False
    epsilon: float = weights.EXPLORATION_EPSILON
    epoch_without_replacement: bool = False

    def __post_init__(self) -> None:
        check_bool(SECTION, "enable", self.enable)
        check_number(SECTION, "epsilon", self.epsilon)
        require(self.epsilon > 0, SECTION, "epsilon", self.epsilon, "must be > 0: every prompt must stay drawable")
        check_bool(SECTION, "epoch_without_replacement", self.epoch_without_replacement)
        # Alone it would be ignored silently, and a run meant to follow the history would shuffle uniformly.
        require(self.enable or not self.epoch_without_replacement, SECTION, "epoch_without_replacement",
                self.epoch_without_replacement, f"acts only on the history sampler, which is off: set {SECTION}.enable"
                "=true as well, or drop it (verl's own sampler already draws every prompt once an epoch, "
                "uniformly)")  # fmt: skip


def sampler_options(data_config: Any) -> SamplerOptions:
    return SamplerOptions.from_mapping(section_options(data_config, "history_sampler"))


def refusals(config: Any) -> list[str]:
    """Why this run cannot use the sampler (empty when it can, or when the sampler is off), each with the fix."""
    data = config_get(config, "data")
    if not sampler_options(data).enable:
        return []
    reasons = []
    record = record_for(config_get(config_get(config, "algorithm"), "adv_estimator"))
    if record is None or record.success_estimates is None:
        with_history = ", ".join(r.name for r in RECORDS if r.success_estimates is not None)
        reasons.append(f"it draws by each prompt's history, and this estimator keeps none: select one that does "
                       f"({with_history}), or turn {SECTION}.enable off")  # fmt: skip
    if not bool(config_get(data, "shuffle")):
        reasons.append("data.shuffle=false asks for the dataset's order, which the sampler replaces: set "
                       "data.shuffle=true, or turn the sampler off")  # fmt: skip
    if bool(config_get(config_get(config_get(config, "algorithm"), "filter_groups"), "enable")):
        reasons.append("algorithm.filter_groups (DAPO's dynamic sampling) would discard the groups the weights chose "
                       f"(and it makes verl fetch one prompt at a time: {ONE_AT_A_TIME}): turn one of them "
                       "off")  # fmt: skip
    reasons += _fetch_refusals(config)
    if int(config_get(data, "dataloader_num_workers") or 0) > 0:
        reasons.append("dataloader workers prefetch batches, so they would be drawn ahead of the history they should "
                       "read, and drawn again otherwise after a resume: set data.dataloader_num_workers=0 (loading "
                       "a row is cheap: verl tokenizes in the agent loop)")  # fmt: skip
    return reasons


def _fetch_refusals(config: Any) -> list[str]:
    """The settings under which verl's dataloader fetches other than ``train_batch_size`` prompts at a time.

    The sampler draws one batch of distinct prompts per fetch. The V1 trainer forces ``data.gen_batch_size=1`` (exact
    refill counts, ``PPOTrainer._create_dataloader`` in verl 0.9.1) in its async modes, with DAPO's filter and with
    ``sync_refill_failed_groups``; a ``gen_batch_size`` the user sets does the same in both trainers.
    """
    reasons = []
    trainer = config_get(config, "trainer")
    v1 = config_get(trainer, "v1")
    if config_get(trainer, "use_v1") is not False:
        mode = config_get(v1, "trainer_mode") or "sync"
        if mode != "sync":
            reasons.append(f"trainer.v1.trainer_mode={mode} makes verl fetch one prompt at a time ({ONE_AT_A_TIME}): "
                           "use trainer.v1.trainer_mode=sync, or turn the sampler off")  # fmt: skip
        if bool(config_get(config_get(v1, "sampler"), "sync_refill_failed_groups")):
            reasons.append(f"trainer.v1.sampler.sync_refill_failed_groups=true makes verl fetch one prompt at a time "
                           f"({ONE_AT_A_TIME}): set it false, or turn the sampler off")  # fmt: skip
    data = config_get(config, "data")
    gen_batch_size, train_batch_size = config_get(data, "gen_batch_size"), config_get(data, "train_batch_size")
    if gen_batch_size is not None and gen_batch_size != train_batch_size:
        reasons.append(f"data.gen_batch_size={gen_batch_size} makes verl fetch {gen_batch_size} prompts at a time, "
                       f"not data.train_batch_size={train_batch_size} (so a step's batch is several draws, which "
                       "can repeat a prompt): set data.gen_batch_size=null")  # fmt: skip
    return reasons


def check_run(config: Any) -> None:
    reasons = refusals(config)
    if reasons:
        raise ValueError(f"{SECTION}.enable=true cannot run here: " + "; ".join(reasons) + ".")


class HistorySampler(torch.utils.data.Sampler[int]):
    """Batches of distinct prompts drawn by the history's weights; stateful for ``StatefulDataLoader``.

    Args:
        dataset: verl's training dataset (an ``RLHFDataset``: its ``dataframe`` gives each row's prompt and
            ``extra_info``; any map-style dataset whose items hold ``raw_prompt`` and ``extra_info`` works).
        batch_size: prompts per batch (verl's ``train_batch_size``).
        seed: ``data.seed`` (the draws are a function of it and the history).
        options: the sampler's options.
        config: the run's full config, or a callable returning it (bound at trainer start in the legacy trainer,
            whose task runner builds the sampler before the trainer).
    """

    def __init__(self, dataset: Any, batch_size: int, seed: int, options: SamplerOptions,
                 config: Any | Callable[[], Any]) -> None:  # fmt: skip
        super().__init__()
        if batch_size > len(dataset):
            raise ValueError(f"The sampler draws {batch_size} distinct prompts a batch from {len(dataset)}.")
        self.dataset, self.batch_size, self.seed, self.options = dataset, batch_size, seed, options
        self._config = config
        self.rng = np.random.default_rng(seed)
        self.batches_in_epoch = len(dataset) // batch_size
        self.drawn_in_epoch = 0
        self.epoch_drawn = np.zeros(len(dataset), dtype=bool)  # which prompts this epoch drew (the epoch option)
        self.draws = 0
        self.pending: deque[dict[str, float]] = deque()  # each drawn batch's metrics, for the step that trains on it
        self._keys: np.ndarray | None = None
        self._clusters: np.ndarray | None = None

    def __len__(self) -> int:
        return self.batches_in_epoch * self.batch_size

    def __iter__(self) -> Iterator[int]:
        while self.drawn_in_epoch < self.batches_in_epoch:
            batch = self._draw()
            self.drawn_in_epoch += 1
            yield from batch.tolist()
        self.start_epoch()

    def start_epoch(self) -> None:
        """Every prompt available again; the RNG carries on, so the next epoch starts where this one ended."""
        self.drawn_in_epoch = 0
        self.epoch_drawn[:] = False

    def _draw(self) -> np.ndarray:
        config = self._config() if callable(self._config) else self._config
        algorithm = config_get(config, "algorithm")
        keys, clusters = self._prompts(config)
        p_hat = success_estimates(algorithm, keys, clusters)
        prompt_weights = weights.prompt_weights(p_hat, self.options.epsilon)
        if self.options.epoch_without_replacement:
            chosen = weights.draw_from_remaining(prompt_weights, self.batch_size, self.epoch_drawn, self.rng)
            self.epoch_drawn[chosen] = True
        else:
            chosen = weights.draw(prompt_weights, self.batch_size, self.rng)
        process = runtime.held(str(algorithm.adv_estimator))
        group_size = int(config_get(config_get(config_get(config, "actor_rollout_ref"), "rollout"), "n") or 1)
        metrics = {
            "sampler/weight_entropy": weights.weight_entropy(prompt_weights),
            "sampler/p_hat_mean_drawn": float(p_hat[chosen].mean()),
            "sampler/zero_variance_expected": weights.zero_variance_expected(p_hat[chosen], group_size),
            "sampler/history_updates_at_draw": float(getattr(process.estimator, "num_updates", 0)) if process else 0.0,
        }  # fmt: skip
        if self.options.epoch_without_replacement:
            metrics["sampler/epoch_drawn_share"] = float(self.epoch_drawn.mean())  # this batch included
        self.pending.append(metrics)
        self.draws += 1
        return chosen

    def _prompts(self, config: Any) -> tuple[np.ndarray, np.ndarray | None]:
        """Every training row's prompt key (and cluster id, where the estimator reads clusters), computed once."""
        if self._keys is None:
            algorithm = config_get(config, "algorithm")
            process = runtime.process_for(str(algorithm.adv_estimator), algorithm)
            field = getattr(process.options, "prompt_key_field", None)
            cluster_key = getattr(process.options, "cluster_key", None)
            prompts, infos = dataset_columns(self.dataset)
            self._keys = np.array([prompt_key(p, i, field) for p, i in zip(prompts, infos, strict=True)],
                                  dtype=object)  # fmt: skip
            if cluster_key is not None:
                self._clusters = np.array([int(i.get(cluster_key, -1)) if isinstance(i, Mapping) else -1
                                           for i in infos], dtype=np.int64)  # fmt: skip
                self._assign_missing(process, prompts, infos)
        return self._keys, self._clusters

    def _assign_missing(self, process: Any, prompts: list[Any], infos: list[Any]) -> None:
        """With ``on_missing_cluster=assign``, the rows without a cluster id get the one the estimator would give them
        (the codebook's encoder, once for the run): an unseen prompt's p^ is then its cluster's m1_k, as for an
        annotated one (history_spec 5), not the 0.5 of a prompt without a cluster."""
        missing = np.flatnonzero(self._clusters < 0)
        if not missing.size or getattr(process.options, "on_missing_cluster", None) != "assign":
            return
        rows = [{"prompt": prompts[i], "extra_info": infos[i]} for i in missing]
        self._clusters[missing] = np.asarray(process.estimator.assign_rows(rows), dtype=np.int64)
        logger.info("history sampler: %d of %d training prompts have no cluster id; assigned by the codebook's "
                    "encoder (on_missing_cluster=assign), as the estimator assigns them at their step. Annotating "
                    "the data offline (`bv-blend codebook`) skips this.", missing.size, len(self._clusters))

    def _check_dataset_size(self, state: Mapping[str, Any]) -> None:
        """Refuse a state drawn from a training set of another size: its RNG and epoch position would index other
        prompts. A state saved before the size was recorded cannot be checked: a warning says so, and it loads."""
        saved = state.get("dataset_size")
        if saved is None:
            logger.warning("history sampler: the checkpoint's sampler state predates its dataset-size record, so a "
                           "resume on a changed training set cannot be detected; it is loaded as it is (this run has "
                           "%d prompts). Make sure the data settings are the checkpoint's.",
                           len(self.dataset))  # fmt: skip
        elif int(saved) != len(self.dataset):
            raise ValueError(_dataset_size_error(int(saved), len(self.dataset)))

    def step_metrics(self, updates_now: int) -> dict[str, float]:
        """The metrics of the oldest batch not yet trained on, with how many updates old its weights were."""
        if not self.pending:
            return {}
        metrics = self.pending.popleft()
        drawn_at = metrics.pop("sampler/history_updates_at_draw")
        return {**metrics, "sampler/weight_age_steps": float(max(updates_now - 1 - drawn_at, 0))}

    # --------------------------------------------------------------------------------------------- state
    def state_dict(self) -> dict[str, Any]:
        return {"rng": self.rng.bit_generator.state, "drawn_in_epoch": self.drawn_in_epoch, "draws": self.draws,
                "seed": self.seed, "batch_size": self.batch_size, "dataset_size": len(self.dataset),
                "epoch_without_replacement": self.options.epoch_without_replacement,
                "epoch_drawn": np.flatnonzero(self.epoch_drawn).tolist()}  # fmt: skip

    def load_state_dict(self, state: Mapping[str, Any]) -> None:
        if state.get("seed") != self.seed or state.get("batch_size") != self.batch_size:
            raise ValueError(
                f"The checkpoint's prompt sampler was made with data.seed={state.get('seed')} and train_batch_size="
                f"{state.get('batch_size')}; this run has {self.seed} and {self.batch_size}. Resume with the original "
                "values."
            )
        self._check_dataset_size(state)
        epoch_drawn = self._saved_epoch_drawn(state)
        rng = np.random.default_rng()
        rng.bit_generator.state = state["rng"]
        self.rng, self.drawn_in_epoch, self.draws = rng, int(state["drawn_in_epoch"]), int(state["draws"])
        self.epoch_drawn = epoch_drawn
        self.pending.clear()

    def _saved_epoch_drawn(self, state: Mapping[str, Any]) -> np.ndarray:
        """The mask of the prompts the saved epoch drew, checked against the saved position before anything changes.

        A checkpoint saved with the option off (or before it existed) recorded no such set: switching the option on
        at a resume is allowed, and the rest of that epoch avoids only the prompts drawn after the resume.
        """
        mask = np.zeros(len(self.dataset), dtype=bool)
        saved_on, now_on = bool(state.get("epoch_without_replacement", False)), self.options.epoch_without_replacement
        if saved_on != now_on:
            logger.warning("history sampler: the checkpoint was drawn with %s.epoch_without_replacement=%s and this "
                           "run has %s; the rest of the current epoch %s.", SECTION, str(saved_on).lower(),
                           str(now_on).lower(), "draws each batch from the whole training set" if saved_on
                           else "may repeat the prompts drawn before the resume")  # fmt: skip
        if not (saved_on and now_on):
            return mask
        indices = np.asarray(state.get("epoch_drawn", []), dtype=np.int64)
        expected = int(state["drawn_in_epoch"]) * self.batch_size
        valid = (indices.size == expected and np.unique(indices).size == indices.size
                 and bool(np.all((indices >= 0) & (indices < mask.size))))  # fmt: skip
        if not valid:
            raise ValueError(f"The checkpoint's prompt sampler records {indices.size} prompts drawn in its epoch, not "
                             f"{expected} distinct ones below {mask.size} ({state['drawn_in_epoch']} batches of "
                             f"{self.batch_size}): its data.pt is damaged or from another run. Resume from another "
                             "checkpoint, or start a fresh run (trainer.resume_mode=disable).")  # fmt: skip
        mask[indices] = True
        return mask


def _dataset_size_error(saved: int, now: int) -> str:
    return (
        f"The checkpoint's prompt sampler drew from a training set of {saved} prompts; this run's has {now}. The "
        "dataset changed since the checkpoint (other data.train_files, data.max_prompt_length or "
        "data.filter_overlong_prompts, another filter), so the saved draws and their epoch position index other "
        "prompts. Resume with the data settings the checkpoint was made with, or start a fresh run on the new data "
        "(trainer.resume_mode=disable, or another trainer.default_local_dir); the sampler has no option to reset "
        "its state alone."
    )


def success_estimates(algorithm: Any, keys: np.ndarray, cluster_ids: np.ndarray | None = None) -> np.ndarray:
    """(P,) p^ of each prompt key from the history of the estimator ``algorithm`` selects: the method its record
    names (``EstimatorRecord.success_estimates``) on the process's estimator (the sampler's and the labs' face)."""
    record = record_for(config_get(algorithm, "adv_estimator"))
    if record is None or record.success_estimates is None:
        raise ValueError(f"adv_estimator={config_get(algorithm, 'adv_estimator')} keeps no history to sample by.")
    built = runtime.process_for(record.name, algorithm).estimator
    p_hat, _ = getattr(built, record.success_estimates)(np.asarray(keys, dtype=object), cluster_ids)
    return np.clip(p_hat, 0.0, 1.0)


def create_rl_sampler(original: Callable[[Any, Any], Any]) -> Callable[[Any, Any], Any]:
    """Wrap verl's ``create_rl_sampler(data_config, dataset)``: the history sampler when it is on, verl's otherwise."""

    def create(data_config: Any, dataset: Any) -> Any:
        options = sampler_options(data_config)
        if not options.enable:
            return original(data_config, dataset)
        if not bool(config_get(data_config, "shuffle")):
            raise ValueError(f"{SECTION}.enable=true needs data.shuffle=true: the sampler replaces the dataset order.")
        batch_size = int(config_get(data_config, "gen_batch_size") or config_get(data_config, "train_batch_size"))
        seed = config_get(data_config, "seed")
        if seed is None:
            logger.warning("bv_blend: data.seed is null, so the history sampler draws from the seed of verl's own "
                           "unseeded sampler (torch.Generator's default, %d): like verl's, every unseeded run draws "
                           "the same batches from the same history. Set data.seed to vary them.", UNSEEDED)  # fmt: skip
        sampler = HistorySampler(dataset, batch_size, UNSEEDED if seed is None else int(seed), options,
                                 runtime.run_config)  # fmt: skip
        runtime.RUN.sampler = sampler
        logger.info("bv_blend: the history sampler draws the training batches (%s).", SECTION)
        return sampler

    return create


def restore_skipped_state(folder: str | None) -> bool:
    """Restore the sampler's own state from ``folder/data.pt`` where verl did not; True if it did.

    verl's legacy trainer skips its dataloader's state when it resumes at an epoch boundary (``_load_checkpoint`` in
    ray_trainer.py: "the saved state marks the dataloader as exhausted"), so a fresh sampler would draw the next
    epoch from ``data.seed``'s first draw instead of where the run left off, and a resumed run would draw other
    batches than an uninterrupted one. The saved state is the sampler's RNG after the epoch: the next epoch starts
    there. Mid-epoch verl restores the loader, but its ``StatefulDataLoader`` hands the state to the sampler only when
    the loop starts iterating: this hook, which runs before, restores that same state first, and the loader's own
    restore then changes nothing (tests/bv_blend/verl/test_sampler.py). Where the sampler's draws already match the
    saved state, nothing is done.
    """
    sampler = runtime.RUN.sampler
    path = os.path.join(folder, "data.pt") if folder is not None else None
    if sampler is None or path is None or not os.path.isfile(path):
        return False
    loader_state = torch.load(path, weights_only=False)  # verl's own file, which verl loads the same way
    state = (loader_state.get("_sampler_iter_state") or {}).get("sampler_state")
    if state is None or int(state.get("draws", -1)) == sampler.draws:
        return False
    sampler.load_state_dict(state)
    if sampler.drawn_in_epoch >= sampler.batches_in_epoch:
        sampler.start_epoch()  # the epoch ended with the checkpoint: the loader starts the next one
    logger.info("history sampler: restored its state of %d draws from %s, which verl skipped", sampler.draws, path)
    return True


__all__ = ["SECTION", "HistorySampler", "SamplerOptions", "check_run", "create_rl_sampler", "restore_skipped_state",
           "success_estimates"]
