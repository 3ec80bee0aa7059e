"""Offline priors from verl's own generation (history_spec 4): the face is ``bv-blend priors``.

The run's training config, as the user trains it, is run by verl's stock trainer in validation-only mode over the
training prompts: ``trainer.val_only=true`` with the training files as ``data.val_files``, N samples a prompt at the
run's sampling settings, the scored generations dumped to ``trainer.validation_data_dir``. The dump is then keyed by
prompt (:func:`bv_blend.history.priors.scores_from_dump`): verl's dump holds each sample's prompt as verl rendered it
(``tokenizer.decode(prompt_ids, skip_special_tokens=True)``) under a fresh uuid, so every training row is rendered
here the same way, with verl's own code (the agent loop's Continuous Token builder, its tokenizer and its prompt
cap), and the strings are matched exactly. docs/priors.md documents the whole path.
"""

from __future__ import annotations

import contextlib
import re
import shlex
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd
from omegaconf import DictConfig, OmegaConf

from bv_blend.history.keys import prompt_key
from bv_blend.history.priors import TrainingPrompt
from bv_blend.verl.overrides import override_value

TRAINER_MODULE = "verl.trainer.main_ppo"
# verl validates before the first step at global step 0, and val_only returns right after: one dump, "0.jsonl".
DUMP_FILE = "0.jsonl"
# The options through which the estimators read a prior file. The generation run must not read one: it may not exist
# yet (it is what this run writes), and the initial policy's samples do not depend on it.
PRIOR_OPTIONS = ("algorithm.bv_blend.prior_file", "algorithm.spo.offline_values")
SINGLE_TURN = "single_turn_agent"
_ANSI = re.compile(r"\x1b\[[0-9;]*m")  # Ray's colours, out of the heartbeat lines
VAL_BATCH_SAMPLES = 4096  # responses per validation batch when data.val_batch_size is unset


@dataclass(frozen=True)
class PriorsJob:
    """One generation run: the trainer's command, where it dumps, and the config it composes to.

    Attributes:
        config_name: verl's ``--config-name`` (``cpu_tiny`` on CPU).
        overrides: the user's overrides, then the validation-only ones (which win).
        dump_dir: ``trainer.validation_data_dir``.
        samples: N, samples per prompt (``rollout.val_kwargs.n``).
        cpu: run through a CPU launcher, which the caller passes to :func:`run_generation` (the repository's CPU
            platform, an instrument outside the package, has one; the package never imports it).
        environment: the variables the run adds to the environment (on CPU, the CPU platform's).
        config: the composed config, with every override.
    """

    config_name: str
    overrides: tuple[str, ...]
    dump_dir: Path
    samples: int
    cpu: bool
    config: DictConfig = field(repr=False)
    environment: Mapping[str, str] = field(default_factory=dict)

    @property
    def argv(self) -> list[str]:
        return [sys.executable, "-m", TRAINER_MODULE, "--config-name", self.config_name, *self.overrides]

    def env(self) -> dict[str, str]:
        """The variables the run adds to the environment."""
        return dict(self.environment)

    def shell(self) -> str:
        """The exact command as one shell line, the environment it needs first."""
        assignments = [f"{key}={shlex.quote(value)}" for key, value in sorted(self.env().items())]
        return " ".join([*assignments, shlex.join(self.argv)])

    @property
    def dump_path(self) -> Path:
        return self.dump_dir / DUMP_FILE


def compose(config_name: str, overrides: Sequence[str]) -> DictConfig:
    """The config verl's ``main_ppo`` composes from ``--config-name config_name`` and ``overrides``.

    Raises:
        ValueError: the name is not a config (verl's or bv_blend's), or an override does not apply.
    """
    from hydra import compose as hydra_compose
    from hydra import initialize_config_module
    from hydra.core.global_hydra import GlobalHydra
    from hydra.errors import HydraException

    GlobalHydra.instance().clear()
    try:
        with initialize_config_module("verl.trainer.config", version_base=None):
            return hydra_compose(config_name=config_name, overrides=list(overrides))
    except HydraException as error:  # one line that says which override or name is wrong
        raise ValueError(f"--config-name {config_name} does not compose with the given overrides: {error}") from error
    finally:
        GlobalHydra.instance().clear()


def train_files(config: DictConfig) -> list[str]:
    files = OmegaConf.select(config, "data.train_files")
    files = [files] if isinstance(files, str) else list(files or [])
    if not files:
        raise ValueError("data.train_files is empty: pass the run's training parquet(s), data.train_files=...")
    return [str(f) for f in files]


def val_only_overrides(config: DictConfig, samples: int, dump_dir: Path) -> list[str]:
    """What turns the training run ``config`` into verl's validation-only generation over its training prompts.

    Raises:
        ValueError: the run samples greedily (temperature <= 0): N samples of one prompt would all be the same.
    """
    rollout = config.actor_rollout_ref.rollout
    temperature = float(rollout.temperature)
    if not temperature > 0:
        raise ValueError(
            f"actor_rollout_ref.rollout.temperature={temperature}: the priors are N samples of the training policy, "
            "and a greedy policy gives N copies of one response. Use the run's sampling temperature (> 0)."
        )
    data = config.data
    overrides = [
        "trainer.val_only=true",
        "trainer.val_before_train=true",  # val_only acts only inside the validation before training
        f"data.val_files={override_value(train_files(config))}",
        # verl draws a subset of data.*_max_samples rows with the same data.shuffle/data.seed in both datasets:
        # the same value gives exactly the training rows (-1: all of them)
        f"data.val_max_samples={override_value(int(data.get('train_max_samples', -1)))}",
        # the training policy's sampling: verl's validation otherwise decodes greedily (val_kwargs.temperature 0)
        f"actor_rollout_ref.rollout.val_kwargs.n={samples}",
        "actor_rollout_ref.rollout.val_kwargs.do_sample=true",
        f"actor_rollout_ref.rollout.val_kwargs.temperature={override_value(temperature)}",
        f"actor_rollout_ref.rollout.val_kwargs.top_p={override_value(float(rollout.top_p))}",
        f"actor_rollout_ref.rollout.val_kwargs.top_k={override_value(int(rollout.top_k))}",
        f"trainer.validation_data_dir={override_value(str(dump_dir))}",
        # the initial policy: never a checkpoint that an earlier run left in trainer.default_local_dir
        "trainer.resume_mode=disable",
    ]
    if data.get("val_batch_size") is None:
        # verl's default is the whole validation set in one batch: with 45k prompts x 8 samples of 8k tokens, ~100 GB
        # in TransferQueue. Batches of ~VAL_BATCH_SAMPLES responses keep the rollout engines busy (each batch also
        # waits on the replay buffer's 2 s poll) at a few GB of host memory; never fewer prompts than a training batch
        prompts = max(int(data.train_batch_size), -(-VAL_BATCH_SAMPLES // samples))
        overrides.append(f"data.val_batch_size={prompts}")
    overrides += [f"{option}=null" for option in PRIOR_OPTIONS if _has_option(config, option)]
    return overrides


def _has_option(config: DictConfig, option: str) -> bool:
    """Whether the config declares ``option`` (set, null, or the mandatory ``???`` of paper/bv_blend_n2_priors)."""
    parent, _, leaf = option.rpartition(".")
    node = OmegaConf.select(config, parent, default=None)
    return isinstance(node, DictConfig) and leaf in node


def prompt_key_field(config: DictConfig) -> str | None:
    """The ``prompt_key_field`` the run keys its prompts by: its estimator's, else the one the other sections agree on.

    Raises:
        ValueError: the run's estimator has none and the sections of SPO and BV-Blend set different ones.
    """
    algorithm = config.algorithm
    own = OmegaConf.select(algorithm, f"{algorithm.adv_estimator}.prompt_key_field", default=None)
    if own is not None:
        return str(own)
    others = {str(v) for name in ("spo", "bv_blend")
              if (v := OmegaConf.select(algorithm, f"{name}.prompt_key_field", default=None)) is not None}
    if len(others) > 1:
        raise ValueError(f"algorithm.spo.prompt_key_field and algorithm.bv_blend.prompt_key_field differ ({others}): "
                         "set the one of the estimator that will read the priors.")
    return others.pop() if others else None


def check_inputs(config: DictConfig) -> None:
    """What can be checked before any worker starts: the files exist, and the prompts are single-turn text.

    Raises:
        ValueError: a missing training file or model folder, or an agent loop whose prompts the dump cannot key.
    """
    for path in train_files(config):
        if "://" not in path and not Path(path).expanduser().is_file():
            raise ValueError(f"data.train_files: {path} does not exist.")
    model = str(config.actor_rollout_ref.model.path)
    if "://" not in model and not Path(model).expanduser().is_dir():
        raise ValueError(f"actor_rollout_ref.model.path: {model} is not a local model folder.")
    rollout = config.actor_rollout_ref.rollout
    agent = OmegaConf.select(rollout, "agent.default_agent_loop", default=SINGLE_TURN)
    if agent != SINGLE_TURN or OmegaConf.select(rollout, "multi_turn.enable", default=False):
        raise ValueError(
            f"The priors are keyed by each sample's single-turn prompt; this run uses agent loop {agent!r} "
            f"(multi_turn.enable={OmegaConf.select(rollout, 'multi_turn.enable', default=False)}). Run it with "
            f"actor_rollout_ref.rollout.agent.default_agent_loop={SINGLE_TURN}."
        )


def plan(config_name: str, user_overrides: Sequence[str], samples: int, dump_dir: Path, cpu: bool,
         environment: Mapping[str, str] | None = None) -> PriorsJob:
    """Compose the run, check it, and return the generation job (nothing starts).

    Raises:
        ValueError: bad samples, a config that does not compose, missing inputs, greedy sampling (messages say which).
    """
    if samples < 1:
        raise ValueError(f"--samples {samples}: each prompt needs at least one sample (SPO's offline_N is 8).")
    training = compose(config_name, user_overrides)
    check_inputs(training)
    overrides = (*user_overrides, *val_only_overrides(training, samples, dump_dir.resolve()))
    return PriorsJob(config_name, overrides, dump_dir.resolve(), samples, cpu, compose(config_name, overrides),
                     dict(environment or {}))


# --- the training prompts, rendered as verl renders them -------------------------------------------------------------


def _plain(value: Any) -> Any:
    """Parquet values (numpy arrays of dicts) as the plain lists and dicts verl's dataset rows hold."""
    if hasattr(value, "tolist") and not isinstance(value, str):
        value = value.tolist()
    if isinstance(value, Mapping):
        return {k: _plain(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    return value


def _container(node: Any) -> dict[str, Any]:
    """A config mapping (or ``None``) as a plain dict."""
    return dict(OmegaConf.to_container(node, resolve=True)) if OmegaConf.is_config(node) else dict(node or {})


def prompt_renderer(config: DictConfig) -> Callable[[list[dict[str, Any]]], str]:
    """``messages -> the dump's input``, built from verl's code as its agent loop builds it.

    ``AgentLoopWorker`` takes the tokenizer from ``HFModelConfig`` (so ``custom_chat_template`` applies) and the
    root ``model_type`` of its HF config; ``AgentLoopBase`` creates the Continuous Token builder with
    ``data.apply_chat_template_kwargs``; the single-turn loop calls ``build_initial_tokens`` (the chat template with
    the generation prompt, tokenized) and left-truncates to ``rollout.prompt_length``; the trainer decodes the ids with
    ``skip_special_tokens=True`` (padding, a special token, drops out).
    """
    from verl.utils import omega_conf_to_dataclass
    from verl.utils.tokenizer.continuous_token_wiring import create_continuous_token_builder

    model = omega_conf_to_dataclass(config.actor_rollout_ref.model)
    model_type = getattr(model.hf_config, "model_type", None)
    data = config.data
    builder = create_continuous_token_builder(
        model.tokenizer,
        hf_model_type=model_type if isinstance(model_type, str) else None,
        chat_template_kwargs=_container(data.get("apply_chat_template_kwargs")),
        mm_processor_kwargs=_container(data.get("mm_processor_kwargs")),
        processor=model.processor,
    )
    prompt_length = int(config.actor_rollout_ref.rollout.prompt_length)
    tokenizer = model.tokenizer

    def render(messages: list[dict[str, Any]]) -> str:
        ids = builder.build_initial_tokens(messages)
        if len(ids) > prompt_length:  # AgentLoopBase._cap_text_prompt_length
            ids = ids[-prompt_length:]
        return tokenizer.decode(ids, skip_special_tokens=True)

    return render


def training_rows(config: DictConfig) -> Iterator[tuple[Any, Any, Any]]:
    """``(prompt, extra_info, ground truth)`` of every row of the training files, in order.

    Raises:
        ValueError: a file has no prompt column, or a row routes to another agent loop or carries images, videos or
            audio (the dump of those is not keyed by a text prompt).
    """
    data = config.data
    column = str(data.get("prompt_key") or "prompt")
    media = [str(data.get(k) or d) for k, d in (("image_key", "images"), ("video_key", "videos"),
                                                 ("audio_key", "audios"))]
    from verl.utils.fs import copy_to_local

    for path in train_files(config):
        frame = pd.read_parquet(copy_to_local(path))  # as verl's dataset reads it (an hdfs:// path is copied first)
        if column not in frame:
            raise ValueError(f"{path} has no column {column!r} (data.prompt_key): its columns are {list(frame)}.")
        for name in media:
            if name in frame and frame[name].map(lambda v: v is not None and len(v) > 0).any():
                raise ValueError(f"{path} has {name}: multimodal prompts are not supported by the offline priors.")
        if "agent_name" in frame and (frame["agent_name"].dropna() != SINGLE_TURN).any():
            raise ValueError(f"{path} routes rows to agent loops other than {SINGLE_TURN} (column agent_name).")
        infos = frame["extra_info"] if "extra_info" in frame else [None] * len(frame)
        rewards = frame["reward_model"] if "reward_model" in frame else [None] * len(frame)
        for prompt, info, reward in zip(frame[column], infos, rewards, strict=True):
            truth = reward.get("ground_truth") if isinstance(reward, Mapping) else None
            yield prompt, info, truth


def render_training_prompts(
    config: DictConfig, progress: Callable[[Iterator[Any], int], Iterator[Any]] | None = None
) -> list[TrainingPrompt]:
    """Every training row's prompt key (as the run's estimator keys it), its prompt as verl's dump writes it, and
    its ground truth. ``progress`` wraps the row iterator (a progress bar)."""
    render = prompt_renderer(config)
    field_name = prompt_key_field(config)
    rows: Iterator[tuple[Any, Any, Any]] = training_rows(config)
    if progress is not None:
        from verl.utils.fs import copy_to_local

        total = sum(len(pd.read_parquet(copy_to_local(p), columns=[])) for p in train_files(config))
        rows = progress(rows, total)
    prompts = []
    for prompt, info, truth in rows:
        messages = _plain(prompt)
        prompts.append(TrainingPrompt(prompt_key(messages, info, field_name), render(messages), _plain(truth)))
    return prompts


# --- the run ---------------------------------------------------------------------------------------------------------


def clear_dump(dump_dir: Path) -> None:
    """Remove the dumps (``<step>.jsonl``) an earlier run left, so that only this run's is read."""
    dump_dir.mkdir(parents=True, exist_ok=True)
    for old in dump_dir.glob("*.jsonl"):
        if old.stem.isdigit():
            old.unlink()


def run_generation(job: PriorsJob, log_path: Path, timeout_s: float | None = None, heartbeat_s: float = 30.0,
                   run_id: str | None = None, cpu_launcher: Callable[..., int] | None = None) -> int:
    """Run the job's trainer to completion; returns its exit code (124 on timeout, CPU only).

    verl's output goes to ``log_path``. On GPU it goes to the terminal too (verl's own progress, as in training);
    on CPU, where the caller's launcher stops every Ray and vLLM process of the run on exit (``run_id`` marks them,
    as the repository's CPU platform does), a line every ``heartbeat_s`` seconds says how long it has run and what
    verl logged last.
    """
    clear_dump(job.dump_dir)
    log_path.parent.mkdir(parents=True, exist_ok=True)
    if job.cpu:
        if cpu_launcher is None:
            raise ValueError("a CPU generation job runs through a CPU launcher: pass cpu_launcher= (the checkout's "
                             "scripts/offline_priors.py --cpu passes the CPU platform's run_trainer).")
        with _heartbeat(log_path, heartbeat_s):
            # the "file" logger of cpu_tiny writes the validation metrics beside the dump, not into the working folder
            return cpu_launcher(list(job.overrides), log_path=log_path, metrics_path=job.dump_dir / "metrics.jsonl",
                                timeout_s=timeout_s, cpu_config=job.config_name, run_id=run_id)
    with open(log_path, "w") as log:
        process = subprocess.Popen(job.argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, bufsize=1)
        assert process.stdout is not None
        for line in process.stdout:
            sys.stdout.write(line)
            log.write(line)
        return process.wait()


@contextlib.contextmanager
def _heartbeat(log_path: Path, every_s: float) -> Iterator[None]:
    """While a CPU run is on (minutes with no output of its own): the time so far and verl's last log line."""
    stop = threading.Event()
    started = time.monotonic()

    def beat() -> None:
        while not stop.wait(every_s):
            try:
                lines = [line for line in log_path.read_text(errors="replace").splitlines() if line.strip()]
            except OSError:
                lines = []
            last = _ANSI.sub("", lines[-1]).strip() if lines else "(starting)"
            print(f"[offline_priors] {time.monotonic() - started:5.0f} s  {last:.110}", flush=True)

    thread = threading.Thread(target=beat, daemon=True)
    thread.start()
    try:
        yield
    finally:
        stop.set()
        thread.join()


__all__ = [
    "DUMP_FILE",
    "PriorsJob",
    "check_inputs",
    "clear_dump",
    "compose",
    "plan",
    "prompt_key_field",
    "prompt_renderer",
    "render_training_prompts",
    "run_generation",
    "training_rows",
    "val_only_overrides",
]
