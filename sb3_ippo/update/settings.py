"""The settings of one group's update, in one frozen object.

:class:`UpdateSettings` is what the update functions take (``build_batch``, ``ppo_update``, their stacked versions),
what the trainer and the learner process receive, and what ``export_agent`` reads. Each setting is written once, as a
field, with the check its value must pass; its default and its documentation are IPPO's (``IPPO.__init__``), which
builds one object per agent group from its own values and the group's ``group_kwargs``.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import numbers
from collections.abc import Callable, Mapping
from dataclasses import field
from typing import Any, Literal

import numpy as np
from stable_baselines3.common.type_aliases import Schedule

KLStop = Literal["after_step", "before_step"]
KL_STOPS: tuple[KLStop, ...] = ("after_step", "before_step")

Check = Callable[[Any], bool]


# ------------------------------------------------------------------------------------------------------------------
# What a value must be
# ------------------------------------------------------------------------------------------------------------------


def is_int(value: Any) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def is_number(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool) and not math.isnan(value)


def positive_int(value: Any) -> bool:
    return is_int(value) and value >= 1


def non_negative_int(value: Any) -> bool:
    return is_int(value) and value >= 0


def positive_number(value: Any) -> bool:
    return is_number(value) and value > 0


def finite_positive_number(value: Any) -> bool:
    return positive_number(value) and math.isfinite(value)


def finite_non_negative_number(value: Any) -> bool:
    return is_number(value) and math.isfinite(value) and value >= 0


def unit_interval(value: Any) -> bool:
    return is_number(value) and 0.0 <= value <= 1.0


def is_bool(value: Any) -> bool:
    return isinstance(value, (bool, np.bool_))


def schedule_or(check: Check) -> Check:
    # A schedule is a function of the remaining progress (1 -> 0): what it returns is checked when it is read.
    return lambda value: (callable(value) and not isinstance(value, type)) or check(value)


def optional(check: Check) -> Check:
    return lambda value: value is None or check(value)


POSITIVE_INT = "a positive integer"
SCHEDULE = " or a schedule (a function of the remaining progress, from 1 to 0)"
TRUE_OR_FALSE = "True or False"


def _rule(check: Check, expected: str, scheduled: bool = False) -> dict[str, Any]:
    """A field's metadata: the check its value must pass, what is expected (for the message), whether it may be a
    schedule."""
    return {"check": check, "expected": expected, "scheduled": scheduled}


# ------------------------------------------------------------------------------------------------------------------
# The settings
# ------------------------------------------------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class UpdateSettings:
    """Every setting of one agent group's update (see ``IPPO``'s docstring for each). ``learning_rate``,
    ``clip_range`` and ``clip_range_vf`` may be schedules of the remaining progress: :meth:`at` resolves them.

    :raises ValueError: at construction, naming the first setting whose value is not valid and what it expects.
    """

    learning_rate: float | Schedule = field(
        metadata=_rule(schedule_or(finite_positive_number), "a positive number" + SCHEDULE, scheduled=True)
    )
    n_epochs: int = field(metadata=_rule(positive_int, POSITIVE_INT + " (passes over each batch)"))
    batch_size: int | None = field(
        metadata=_rule(optional(positive_int), POSITIVE_INT + " (transitions per minibatch) or None (the whole batch)")
    )
    gamma: float = field(metadata=_rule(unit_interval, "a number in [0, 1]"))
    gae_lambda: float = field(metadata=_rule(unit_interval, "a number in [0, 1]"))
    time_limit_bootstrap: bool = field(
        metadata=_rule(is_bool, "True (a truncated episode bootstraps V(s_T)) or False (it bootstraps 0)")
    )
    clip_range: float | Schedule = field(
        metadata=_rule(schedule_or(finite_positive_number), "a positive number" + SCHEDULE, scheduled=True)
    )
    clip_range_vf: float | Schedule | None = field(
        metadata=_rule(
            optional(schedule_or(finite_positive_number)),
            "None (no value clipping), a positive number" + SCHEDULE,
            scheduled=True,
        )
    )
    normalize_advantage: bool = field(metadata=_rule(is_bool, TRUE_OR_FALSE))
    ent_coef: float = field(metadata=_rule(finite_non_negative_number, "a number >= 0"))
    vf_coef: float = field(metadata=_rule(finite_non_negative_number, "a number >= 0"))
    max_grad_norm: float | None = field(
        metadata=_rule(optional(positive_number), "a positive number or None (no gradient clipping)")
    )
    target_kl: float | None = field(metadata=_rule(optional(positive_number), "a positive number or None (no KL early stop)"))
    kl_stop: KLStop = field(
        metadata=_rule(lambda value: value in KL_STOPS, '"after_step" (the reference) or "before_step" (SB3)')
    )
    recompute_values: bool = field(metadata=_rule(is_bool, TRUE_OR_FALSE))
    recompute_log_prob: bool = field(metadata=_rule(is_bool, TRUE_OR_FALSE))
    shuffle_minibatches: bool = field(metadata=_rule(is_bool, TRUE_OR_FALSE))

    def __post_init__(self) -> None:
        for name in UPDATE_SETTINGS:
            check_setting(name, getattr(self, name))

    @classmethod
    def from_values(cls, values: Mapping[str, Any], overrides: Mapping[str, Any] | None = None) -> UpdateSettings:
        """The settings named by this class, taken from ``overrides`` where it has them, else from ``values``
        (a mapping, such as a model's settings; other names in either are ignored)."""
        overrides = overrides or {}
        return cls(**{name: overrides[name] if name in overrides else values[name] for name in UPDATE_SETTINGS})

    def at(self, progress_remaining: float) -> UpdateSettings:
        """These settings with every schedule read at ``progress_remaining`` (from 1 at the start of ``learn`` to 0).
        What a schedule returns is its own business, as in SB3's PPO (a linear schedule ends at 0): it is not checked."""
        resolved = copy.copy(self)
        for name in SCHEDULED_SETTINGS:
            value = getattr(self, name)
            if callable(value):
                object.__setattr__(resolved, name, value(progress_remaining))
        return resolved


# The names of the settings, and of those that may be schedules: read from the class, never written out again.
UPDATE_SETTINGS: tuple[str, ...] = tuple(setting.name for setting in dataclasses.fields(UpdateSettings))
SCHEDULED_SETTINGS: tuple[str, ...] = tuple(
    setting.name for setting in dataclasses.fields(UpdateSettings) if setting.metadata["scheduled"]
)
# name -> (check, what is expected): the update settings' part of ``sb3_ippo.hyperparams.validation.RULES``.
UPDATE_SETTING_RULES: dict[str, tuple[Check, str]] = {
    setting.name: (setting.metadata["check"], setting.metadata["expected"]) for setting in dataclasses.fields(UpdateSettings)
}


def check_setting(name: str, value: Any) -> None:
    """:raises ValueError: naming the update setting ``name``, what it expects and the ``value`` given."""
    check, expected = UPDATE_SETTING_RULES[name]
    if not check(value):
        raise ValueError(f"{name} must be {expected}; got {value!r}")
