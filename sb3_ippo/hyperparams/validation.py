"""Validation of IPPO's hyperparameters: each one checked on its own, then the combinations that cannot work.

Every message names the hyperparameter, says what is expected and shows the value given, so that a typo or a
wrong sign fails at construction (or at ``learn``, after attributes were changed) instead of training on it.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from typing import Any

from sb3_ippo.common.buffer import VERSION_STAMPS
from sb3_ippo.update.settings import (
    POSITIVE_INT,
    TRUE_OR_FALSE,
    UPDATE_SETTING_RULES,
    Check,
    is_bool,
    is_int,
    non_negative_int,
    optional,
    positive_int,
)

# name -> (check, what is expected)
RULES: dict[str, tuple[Check, str]] = {
    **UPDATE_SETTING_RULES,
    "n_steps": (optional(positive_int), POSITIVE_INT + " (transitions per agent per update) or None"),
    "n_episodes": (
        optional(positive_int), POSITIVE_INT + " (trajectories per agent per update), or None (n_steps or rollout_len decide)"
    ),
    "max_version_lag": (non_negative_int, "a non-negative integer (0 keeps only data from the current policy)"),
    "normalize_obs": (is_bool, TRUE_OR_FALSE),
    "use_sde": (is_bool, TRUE_OR_FALSE),
    "sde_sample_freq": (
        is_int,
        "an integer: new gSDE exploration matrices every n env steps, or -1 (only at the start of each rollout)",
    ),
    "normalize_returns": (is_bool, TRUE_OR_FALSE),
    "rollout_len": (optional(positive_int), POSITIVE_INT + " (steps of each env copy per rollout) or None (whole episodes)"),
    "align_rollouts": (is_bool, TRUE_OR_FALSE),
    "max_episode_steps": (optional(positive_int), POSITIVE_INT + " or None (the env decides)"),
    "max_buffered_episodes": (optional(positive_int), POSITIVE_INT + " or None (unbounded)"),
    "version_stamp": (lambda value: value in VERSION_STAMPS, '"episode_end" (the reference) or "first_step"'),
    "groups": (
        optional(lambda value: isinstance(value, Mapping) and all(isinstance(ids, (list, tuple)) for ids in value.values())),
        "a dict {group name: [agent ids]} or None (grouped by id prefix and spaces)",
    ),
    "share_parameters": (
        lambda value: is_bool(value) or (isinstance(value, Mapping) and all(is_bool(v) for v in value.values())),
        "True, False or a dict {group name: bool}",
    ),
    "group_kwargs": (
        optional(lambda value: isinstance(value, Mapping) and all(isinstance(v, Mapping) for v in value.values())),
        "a dict {group name: {setting: value}} or None",
    ),
    "batched": (is_bool, TRUE_OR_FALSE),
    "opponents": (
        optional(lambda value: isinstance(value, Mapping)),
        "a dict {seat: opponent} such as {'player_2': 'random'} (an opponent: 'random', a model, a function), or None",
    ),
    "self_play_pool": (
        optional(
            lambda value: isinstance(value, Mapping)
            and set(value) == {"snapshot_every", "size"}
            and all(positive_int(v) for v in value.values())
        ),
        "dict(snapshot_every=K, size=M) with positive integers K (updates between snapshots) and M (snapshots kept), "
        "or None",
    ),
    "async_training": (
        lambda value: is_bool(value) or value == "auto",
        'True (a learner process), False (updates in this process) or "auto" (a learner process where it pays)',
    ),
    "stats_window_size": (positive_int, POSITIVE_INT + " (episodes averaged in rollout/ep_rew_mean)"),
    "policy_kwargs": (optional(lambda value: isinstance(value, Mapping)), 'a dict such as dict(net_arch=[64, 64]), or None'),
    "verbose": (non_negative_int, "0 (no output), 1 (training information) or 2 (also per-agent keys on stdout)"),
    "seed": (optional(is_int), "an integer or None"),
    "tensorboard_log": (optional(lambda value: isinstance(value, (str, os.PathLike))), "a folder path or None"),
}


def check_hyperparameter(name: str, value: Any) -> None:
    """:raises ValueError: naming ``name``, what it expects and the ``value`` given, if ``value`` is not valid."""
    check, expected = RULES[name]
    if not check(value):
        raise ValueError(f"{name} must be {expected}; got {value!r}")


def check_hyperparameters(values: Mapping[str, Any]) -> None:
    """Check each hyperparameter of ``values`` (names of :data:`RULES`; others are ignored), then their combinations.

    :raises ValueError: for the first invalid value or combination, naming the hyperparameters involved.
    """
    for name, value in values.items():
        if name in RULES:
            check_hyperparameter(name, value)
    n_steps, n_episodes = values.get("n_steps"), values.get("n_episodes")
    if "n_episodes" in values and n_steps is None and n_episodes is None and values.get("rollout_len") is None:
        raise ValueError(
            "n_episodes and n_steps are both None (and rollout_len too): nothing would ever trigger an update. Set "
            "n_episodes (finished trajectories per agent per update, e.g. 8) or n_steps (transitions per agent per "
            "update, e.g. 2048), or rollout_len (an update every rollout_len steps of each env copy, as SB3's n_steps)."
        )
    _check_update_trigger(values)
    for group, settings in (values.get("group_kwargs") or {}).items():
        for name, value in settings.items():
            if name in RULES:
                try:
                    check_hyperparameter(name, value)
                except ValueError as error:
                    raise ValueError(f"group_kwargs[{group!r}]: {error}") from None
    if values.get("async_training") is True and values.get("max_version_lag", 1) < 1:
        raise ValueError(
            "async_training collects each batch with the previous policy version, which max_version_lag=0 would "
            "drop as stale: use max_version_lag >= 1 or async_training=False"
        )


def _check_update_trigger(values: Mapping[str, Any]) -> None:
    """Refuse a buffer bound under which no update could ever be due (collection would reject trajectories forever).
    With ``n_steps`` (or ``rollout_len``, whose rule takes ``rollout_len * n_envs`` transitions, with ``values``'
    ``n_envs`` where known, else at least one copy's), that is known where trajectories have a known maximum length
    (``rollout_len``, ``max_episode_steps``); otherwise learn says so as soon as a buffer is full and still not ready."""
    max_buffered = values.get("max_buffered_episodes")
    if max_buffered is None:
        return
    n_steps, n_episodes = values.get("n_steps"), values.get("n_episodes")
    if n_steps is None and n_episodes is None and values.get("rollout_len") is not None:
        n_steps = values["rollout_len"] * values.get("n_envs", 1)
    if n_steps is None:
        if n_episodes is not None and max_buffered < n_episodes:
            raise ValueError(
                f"max_buffered_episodes ({max_buffered}) must be at least n_episodes ({n_episodes}), or no update could "
                "ever be due"
            )
        return
    lengths = [values[name] for name in ("rollout_len", "max_episode_steps") if values.get(name) is not None]
    if lengths and max_buffered * min(lengths) < n_steps:
        raise ValueError(
            f"max_buffered_episodes ({max_buffered}) trajectories of at most {min(lengths)} steps (rollout_len / "
            f"max_episode_steps) cannot cover n_steps ({n_steps}), so no update could ever be due: raise "
            f"max_buffered_episodes to at least {-(-n_steps // min(lengths))}"
        )
