"""Reading a verl config: which of our estimators it selects, its ``algorithm.<section>`` options, and the base of
every estimator's glue options.

verl hands every advantage estimator the raw ``config.algorithm`` node (an OmegaConf ``DictConfig``, or ``None`` when
``compute_advantage`` is called directly). Each estimator's glue options class (:class:`GlueOptions`) turns its
section into validated options, with the defaults of its dataclass for every key that is absent (so
``+algorithm.<section>.x=...`` on verl's stock config works too).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from omegaconf import DictConfig, OmegaConf

from bv_blend.core.options import check_bool, check_optional_text, config_mismatch
from bv_blend.verl.overrides import override_value
from bv_blend.verl.records import BY_NAME, POLICY_LOSSES, PROMPT_KEYS, EstimatorRecord, record_for

NTF_LOSS = next(iter(POLICY_LOSSES))
# The per-row fields of verl's batch that a step's inputs are read from: the prompt uid and the dataset row's
# extra_info, and, for prompt keys and on-the-fly clusters, the prompt's text (the dataset's column or its messages).
ROW_FIELDS = ("uid", "extra_info")
TEXT_FIELDS = ("prompt", "raw_prompt")
Columns = Mapping[str, Sequence[Any] | None]


class GlueOptions:
    """What the glue of one estimator reads from ``algorithm.<section>``, and how it builds and checkpoints the
    process's estimator. Subclasses are frozen dataclasses (``==`` says whether the options changed).

    The defaults below suit an estimator whose built object is its verl-free estimator, with ``state_dict`` /
    ``load_state_dict`` / ``config`` / ``num_updates``.
    """

    NAME: ClassVar[str]  # the record's name
    allow_state_reset: bool = False

    @classmethod
    def record(cls) -> EstimatorRecord:
        return BY_NAME[cls.NAME]

    @classmethod
    def from_algorithm(cls, algorithm: Any) -> GlueOptions:
        """Validate the section; raises ``ValueError`` naming any unknown key or invalid value."""
        raise NotImplementedError

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        """Every key of the section with its default (what the configs declare)."""
        raise NotImplementedError

    def build(self) -> Any:
        """The process's estimator for these options (with an empty history)."""
        raise NotImplementedError

    def prepare(self, built: Any, config: Any) -> None:
        """At trainer start, with the full trainer config: what needs more than the options (no-op by default)."""

    def start(self, built: Any, prompts: Mapping[str, int | None]) -> None:
        """What :meth:`prepare` does with the training prompts (key -> cluster id or ``None``), given directly:
        ``bv_blend.verl.offline.start_run`` calls it outside a trainer (no-op by default)."""

    def inputs(self) -> frozenset[str]:
        """The per-batch inputs this run needs from the trainer hooks (``records.CLUSTER_IDS`` ...)."""
        return self.record().inputs

    def fields_needed(self) -> tuple[str, ...]:
        """The per-row fields of verl's batch that :meth:`step_inputs` reads (none: the hook reads nothing)."""
        return ()

    def step_inputs(self, built: Any, columns: Columns) -> dict[str, Any]:
        """This step's inputs for the estimator's channel (``bv_blend.verl.channel.StepChannel`` fields), built from
        the batch's per-row ``columns`` (:meth:`fields_needed`, ``None`` for a field no row has)."""
        return {}

    def advantages(
        self, built: Any, token_level_rewards: Any, response_mask: Any, index: Any, step: Any
    ) -> tuple[Any, Any]:
        """One call's ``(advantages, returns)``: the built estimator's token-level face with this step's channel
        (``bv_blend.verl.channel.StepChannel``). By default it groups rows by uid and reads only the multi-output
        sources."""
        if index is None:
            raise ValueError(
                f"{self.NAME} groups rows by prompt uid: verl passes it as `index` when the batch has 'uid'."
            )
        sources = step.sources_for(response_mask.shape[0])
        return built.compute_token_level(token_level_rewards, response_mask, index, source_rows=sources)

    def metrics(self, built: Any) -> Mapping[str, float]:
        """The metrics of the built estimator's last call."""
        return built.metrics

    def group_details(self, built: Any) -> Mapping[str, Mapping[str, float]]:
        """uid -> what the built estimator's last call took from its history for that group (the group record's);
        none for an estimator that keeps no per-group trace."""
        trace = getattr(built, "last_groups", None)
        return {} if trace is None else trace.by_group()

    def save(self, built: Any) -> dict[str, Any]:
        """What its checkpoint file holds besides the file's format and versions."""
        return {"estimator": built.state_dict()}

    def spell(self, name: str, value: Any) -> str:
        """The override that sets the estimator parameter ``name`` to ``value`` (in resume hints)."""
        return f"{self.record().option_section}.{name}={override_value(value)}"

    def restore(self, built: Any, payload: Mapping[str, Any], path: str) -> None:
        """Load a saved history into ``built``; every check runs before anything changes (``ValueError``)."""
        state = payload.get("estimator")
        saved = state.get("config") if isinstance(state, Mapping) else None
        if not isinstance(saved, Mapping):
            raise ValueError(f"{path} holds no {self.record().label} estimator state: the file is corrupt.")
        mismatch = config_mismatch(saved, built.config.to_dict(), self.spell)
        if mismatch:
            raise ValueError(f"{path} was written with {mismatch}.")
        built.load_state_dict(state)


@dataclass(frozen=True)
class HistoryOptions(GlueOptions):
    """The section of an estimator with a per-prompt history: its math's frozen config (``CONFIG``) beside the
    glue's own keys, in one ``algorithm.<section>``; each prompt keyed by its text or ``extra_info[prompt_key_field]``.

    Attributes:
        config: the estimator's parameters (a ``core.options.OptionsMixin`` dataclass).
        prompt_key_field: key each prompt by ``extra_info[field]`` (``index`` ...) instead of a hash of its text.
        allow_state_reset: on resume, start the history afresh instead of failing on a missing or mismatched state.
    """

    CONFIG: ClassVar[type]

    config: Any = None
    prompt_key_field: str | None = None
    allow_state_reset: bool = False

    def __post_init__(self) -> None:
        section = self.record().option_section
        check_optional_text(section, "prompt_key_field", self.prompt_key_field)
        check_bool(section, "allow_state_reset", self.allow_state_reset)

    @classmethod
    def glue_keys(cls) -> frozenset[str]:
        return frozenset(f.name for f in dataclasses.fields(cls)) - {"config"}

    @classmethod
    def estimator_keys(cls) -> frozenset[str]:
        return frozenset(f.name for f in dataclasses.fields(cls.CONFIG))

    @classmethod
    def from_algorithm(cls, algorithm: Any) -> HistoryOptions:
        section = cls.record().option_section
        options = section_options(algorithm, cls.record().section)
        unknown = sorted(set(options) - cls.glue_keys() - cls.estimator_keys())
        if unknown:
            raise ValueError(
                f"Unknown option(s) {section}.{{{', '.join(unknown)}}}. Estimator options: "
                f"{sorted(cls.estimator_keys())}; verl glue options: {sorted(cls.glue_keys())}. Check the spelling."
            )
        glue = {key: options.pop(key) for key in list(options) if key in cls.glue_keys()}
        return cls(config=cls.CONFIG.from_mapping(options), **glue)

    @classmethod
    def defaults(cls) -> dict[str, Any]:
        glue = cls(config=cls.CONFIG())
        return {**glue.config.to_dict(), **{key: getattr(glue, key) for key in cls.glue_keys()}}

    def fields_needed(self) -> tuple[str, ...]:
        return (*ROW_FIELDS, *TEXT_FIELDS) if PROMPT_KEYS in self.inputs() else ()

    def step_inputs(self, built: Any, columns: Columns) -> dict[str, Any]:
        if PROMPT_KEYS not in self.inputs():
            return {}
        from bv_blend.verl.prompt_keys import build_prompt_keys

        return {"prompt_keys": build_prompt_keys(columns, self.prompt_key_field)}


def config_get(node: Any, key: str) -> Any:
    """``node.get(key)`` for dicts and DictConfigs (struct mode included), ``getattr`` for namespaces."""
    if node is None:
        return None
    if isinstance(node, (Mapping, DictConfig)):
        return node.get(key)
    return getattr(node, key, None)


def section_options(algorithm_config: Any, name: str) -> dict[str, Any]:
    """``algorithm.<name>`` as a plain dict (empty when absent); an error when it is not a mapping."""
    node = config_get(algorithm_config, name) if algorithm_config is not None else None
    if isinstance(node, DictConfig):
        return OmegaConf.to_container(node, resolve=True)
    if node is None or isinstance(node, Mapping):
        return dict(node or {})
    raise ValueError(f"algorithm.{name} must be a mapping of options, got {type(node).__name__}.")


def unknown_keys(options: Mapping[str, Any], known: set[str] | frozenset[str], section: str) -> None:
    """A misspelt key is an error that names it and the known ones, not a silently ignored default."""
    unknown = sorted(set(options) - set(known))
    if unknown:
        raise ValueError(
            f"Unknown option(s) {section}.{{{', '.join(unknown)}}}. Known options: {sorted(known)}. Check the spelling."
        )


def selected_record(config: Any) -> EstimatorRecord | None:
    """The record of our estimator that the full trainer config selects, or ``None`` for any other estimator."""
    return record_for(config_get(config_get(config, "algorithm"), "adv_estimator"))


def uses_ntf(config: Any) -> bool:
    """True when the full trainer config selects ``actor_rollout_ref.actor.policy_loss.loss_mode=ntf``."""
    actor = config_get(config_get(config, "actor_rollout_ref"), "actor")
    return str(config_get(config_get(actor, "policy_loss"), "loss_mode")) == NTF_LOSS


__all__ = [
    "NTF_LOSS",
    "TEXT_FIELDS",
    "GlueOptions",
    "HistoryOptions",
    "config_get",
    "section_options",
    "selected_record",
    "unknown_keys",
    "uses_ntf",
]
