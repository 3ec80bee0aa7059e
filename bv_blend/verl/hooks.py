"""Trainer hooks, installed when verl imports its trainer modules (see ``plugin.py``).

Every hook is a pass-through unless the run selects one of our estimators (any record of ``records.RECORDS``, by
``algorithm.adv_estimator``) or our loss (``policy_loss.loss_mode=ntf``), so other runs execute verl's code
unchanged. Nothing here knows one estimator from another: what a step needs comes from its options
(``GlueOptions.fields_needed`` / ``step_inputs``).

V1 (``verl.trainer.ppo.v1.trainer_base.PPOTrainer``, the default ``trainer.use_v1=true``; covers the sync,
colocate_async and separate_async modes, none of which overrides these methods):
  ``__init__``            validate the options, build the estimator and refuse unsound stacks
                          (``compositions.check_run``) before any worker or vLLM server starts;
  ``_compute_advantage``  open the step's channel around verl's own method (multi-output sessions; the inputs
                          that the options of the estimator built at trainer start build from the fields they ask
                          for, read from TransferQueue), then add the channel's metrics (the estimator's, and the
                          prompt sampler's) to the step's ``metrics``;
  ``_compute_metrics``    add ``reward/verifier_failures`` to the step's ``metrics`` (every run, as legacy does);
  ``_save_checkpoint``    write ``global_step_N/<record.state_file>`` (before verl's save, see ``state.py``);
  ``_load_checkpoint``    restore it after verl's load.

Legacy (``verl.trainer.ppo.ray_trainer``, ``trainer.use_v1=false``): the same three ``RayPPOTrainer`` methods,
plus the module globals that ``RayPPOTrainer.fit`` calls: ``compute_advantage`` (the same channel, its inputs built
from ``data.non_tensor_batch``; the metrics it returns ride on the batch's ``meta_info``) and
``compute_data_metrics`` (moves them into the step dict, and adds ``reward/verifier_failures``).

NTF's ``ntf/*`` metrics need no hook: the loss returns them and verl logs them with the actor's (``actor/ntf/*``).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

from bv_blend.codebook import CLUSTER_KEY
from bv_blend.verl import advisor, group_record, runtime
from bv_blend.verl.channel import advantage_step, current_step, report_metrics
from bv_blend.verl.multi_output import final_output_rows
from bv_blend.verl.options import config_get, selected_record
from bv_blend.verl.patching import wrap
from bv_blend.verl.records import record_for

# Where the legacy trainer's batch carries the estimator's metrics from compute_advantage to compute_data_metrics.
METRICS_KEY = "bv_blend_metrics"
# The reward_extra_info key of the paper's reward (bv_blend.paper.rewards.FAILURE_KEY: 1.0 where math-verify failed
# on the answer), and the step metric that sums it; neither trainer's training loop logs reward extras otherwise.
VERIFIER_FAILURE_KEY = "verifier_failure"
VERIFIER_FAILURES_METRIC = "reward/verifier_failures"


# ------------------------------------------------------------------------------------------------ shared
def _checked_init(legacy: bool) -> Callable[[Callable], Callable]:
    def make(original: Callable) -> Callable:
        def __init__(self, config, *args, **kwargs):
            from bv_blend.verl import context_budget
            from bv_blend.verl.compositions import check_run

            check_run(config, legacy=legacy)  # bad options / missing codebook / unsound stacks fail here
            group_record.check_run(config, legacy)
            context_budget.check_run(config)  # a prompt + response budget over the model's context fails here
            result = original(self, config, *args, **kwargs)
            advisor.advise_trainer(self)  # a warning at most; V1 has no train_dataset yet: its first step advises
            return result

        return __init__

    return make


def _saving(original: Callable) -> Callable:
    def _save_checkpoint(self, *args, **kwargs):
        if selected_record(self.config) is not None:
            from bv_blend.verl.state import save_state

            save_state(self)
        return original(self, *args, **kwargs)

    return _save_checkpoint


def _loading(original: Callable) -> Callable:
    def _load_checkpoint(self, *args, **kwargs):
        result = original(self, *args, **kwargs)
        if selected_record(self.config) is not None:
            from bv_blend.verl.sampler import restore_skipped_state
            from bv_blend.verl.state import restore_state, resume_folder

            restore_state(self)
            restore_skipped_state(resume_folder(self.config))
        return result

    return _load_checkpoint


def _install_trainer_hooks(trainer_cls: type, legacy: bool) -> None:
    wrap(trainer_cls, "__init__", ("self", "config"), _checked_init(legacy))
    wrap(trainer_cls, "_save_checkpoint", ("self",), _saving)
    wrap(trainer_cls, "_load_checkpoint", ("self",), _loading)


# -------------------------------------------------------------------------------------------------- V1
def install_sampler(module: Any) -> None:
    """Post-import hook of every module that binds verl's ``create_rl_sampler`` (the prompt sampler's way in)."""
    from bv_blend.verl.sampler import create_rl_sampler

    wrap(module, "create_rl_sampler", ("data_config", "dataset"), create_rl_sampler)


def install_v1(trainer_base: Any) -> None:
    """Post-import hook of ``verl.trainer.ppo.v1.trainer_base``."""
    trainer_cls = trainer_base.PPOTrainer
    install_sampler(trainer_base)
    _install_trainer_hooks(trainer_cls, legacy=False)
    wrap(trainer_cls, "_compute_advantage", ("self", "batch", "metrics"), _v1_compute_advantage)
    wrap(trainer_cls, "_compute_metrics", ("self", "batch", "metrics"), _v1_compute_metrics)


def _v1_compute_advantage(original: Callable) -> Callable:
    def _compute_advantage(self, batch, metrics):
        record = selected_record(self.config)
        record_file = group_record.record_path(self.config)
        if record is None and record_file is None:
            return original(self, batch, metrics)
        inputs: dict[str, Any] = {}
        if record is not None:
            process = runtime.process_for(record.name, self.config.algorithm)  # the one trainer start built
            columns = _v1_fetch(batch, process.options.fields_needed())
            inputs = process.options.step_inputs(process.estimator, columns)
        with advantage_step(**inputs, output_sources=final_output_rows(list(batch.keys))) as step:
            result = original(self, batch, metrics)
            if record is not None:
                report_metrics(runtime.sampler_metrics(process))
                report_metrics(advisor.step_metrics(self))
        metrics.update(step.metrics)
        if record_file is not None:
            _v1_record_groups(self, batch, step, record_file)
        return result

    return _compute_advantage


def _v1_record_groups(trainer: Any, batch: Any, step: Any, path: Any) -> None:
    """Appends the step's group record (``bv_blend.verl.group_record``), read back after verl wrote the
    advantages."""
    from bv_blend.verl.prompt_keys import build_prompt_keys

    columns = _v1_fetch(batch, group_record.FIELDS)
    key_field = config_get(config_get(trainer.config.algorithm, "bv_blend") or {}, "prompt_key_field")
    keys = step.prompt_keys or build_prompt_keys(columns, key_field)
    cluster_key = config_get(config_get(trainer.config.algorithm, "bv_blend"), "cluster_key") or CLUSTER_KEY
    lines = group_record.group_lines(trainer.global_steps, columns, keys, step.group_details, cluster_key)
    group_record.append(path, lines)


def _v1_fetch(batch: Any, fields: tuple[str, ...]) -> dict[str, list | None]:
    """Per-row ``fields`` of a ``KVBatchMeta``, in ``batch.keys`` order (``None`` for a field no row has).

    TransferQueue returns non-tensor fields as list-like stacks and silently omits fields no row has.
    """
    if not fields:
        return {}
    if len(batch.keys) == 0:
        return {name: [] for name in fields}
    import transfer_queue as tq

    data = tq.kv_batch_get(keys=batch.keys, partition_id=batch.partition_id, select_fields=list(fields))
    present = set(data.keys())
    return {name: list(data[name]) if name in present else None for name in fields}


def _v1_compute_metrics(original: Callable) -> Callable:
    # fit calls _compute_metrics once per step, on the step's whole batch (every parameter_sync_step mini-batch)
    # and before it clears the batch from TransferQueue: the one V1 place where a step's reward extras are still
    # readable and its logged metrics still open.
    def _compute_metrics(self, batch, metrics, *args, **kwargs):
        result = original(self, batch, metrics, *args, **kwargs)
        failures = _v1_verifier_failures(batch)
        if failures is not None:
            metrics[VERIFIER_FAILURES_METRIC] = failures
        return result

    return _compute_metrics


def _v1_verifier_failures(batch: Any) -> float | None:
    """The sum of ``verifier_failure`` over the batch's real rows; ``None`` where no row's reward gave one.

    The streaming reward loop leaves a row's extras in its ``extra_fields["reward_extra_info"]``; a colocated reward
    model's are written back as fields of their own (``PPOTrainer._compute_reward_colocate``). verl's padding rows
    copy the first row's fields, so they are left out, as verl's own metrics leave them out.
    """
    keys = [key for key, tag in zip(batch.keys, batch.tags, strict=True) if not tag.get("is_padding", False)]
    if not keys:
        return None
    import transfer_queue as tq

    data = tq.kv_batch_get(
        keys=keys, partition_id=batch.partition_id, select_fields=[VERIFIER_FAILURE_KEY, "extra_fields"]
    )
    present = set(data.keys())  # TransferQueue omits a field no row has
    if VERIFIER_FAILURE_KEY in present:
        values = list(data[VERIFIER_FAILURE_KEY])
    else:
        rows = [getattr(row, "data", row) for row in data["extra_fields"]] if "extra_fields" in present else []
        infos = [(row.get("reward_extra_info") or {}) if isinstance(row, dict) else {} for row in rows]
        values = [info[VERIFIER_FAILURE_KEY] for info in infos if VERIFIER_FAILURE_KEY in info]
        if not values:
            return None
    return float(sum(float(value) for value in values if value is not None))


# ---------------------------------------------------------------------------------------------- legacy
def install_legacy(ray_trainer: Any) -> None:
    """Post-import hook of ``verl.trainer.ppo.ray_trainer``."""
    install_sampler(ray_trainer)
    _install_trainer_hooks(ray_trainer.RayPPOTrainer, legacy=True)
    wrap(ray_trainer, "compute_advantage", ("data", "adv_estimator"), _legacy_compute_advantage)
    wrap(ray_trainer, "compute_data_metrics", ("batch",), _legacy_compute_data_metrics)


def _legacy_compute_advantage(original: Callable) -> Callable:
    signature = inspect.signature(original)

    def compute_advantage(data, adv_estimator, *args, **kwargs):
        record = record_for(adv_estimator)
        # V1 imports this same function by name (v1/utils.py); there its own hook has opened the step already.
        if record is None or current_step() is not None:
            return original(data, adv_estimator, *args, **kwargs)
        config = signature.bind(data, adv_estimator, *args, **kwargs).arguments.get("config")
        process = runtime.process_for(record.name, config)
        fields = process.options.fields_needed()
        columns = {name: data.non_tensor_batch.get(name) for name in fields}
        if fields and columns["uid"] is None:
            return original(data, adv_estimator, *args, **kwargs)  # the estimator raises its clear error
        with advantage_step(**process.options.step_inputs(process.estimator, columns)) as step:
            result = original(data, adv_estimator, *args, **kwargs)
            report_metrics(runtime.sampler_metrics(process))
            report_metrics(advisor.step_metrics())
        result.meta_info[METRICS_KEY] = step.metrics
        return result

    return compute_advantage


def _legacy_compute_data_metrics(original: Callable) -> Callable:
    # RayPPOTrainer.fit calls compute_data_metrics once per step on the batch compute_advantage returned, and merges
    # the result into the step's metrics dict: the one place in the legacy loop where the estimator's metrics can
    # join it. They ride on the batch itself, so no state outlives the step.
    signature = inspect.signature(original)

    def compute_data_metrics(*args, **kwargs):
        metrics = original(*args, **kwargs)
        batch = signature.bind(*args, **kwargs).arguments.get("batch")
        meta_info = getattr(batch, "meta_info", None)
        if isinstance(meta_info, dict):
            metrics.update(meta_info.pop(METRICS_KEY, {}))
        # The reward's verifier failures, for every run (ray_trainer puts reward_extra_info in non_tensor_batch).
        failures = (getattr(batch, "non_tensor_batch", None) or {}).get(VERIFIER_FAILURE_KEY)
        if failures is not None:
            metrics[VERIFIER_FAILURES_METRIC] = float(sum(float(f) for f in failures if f is not None))
        return metrics

    return compute_data_metrics
