"""What passes between an agent's policy and the env: channel-last images become channel-first on the way in, and
discrete actions get their space's ``start`` on the way out.

PettingZoo envs give images as (height, width, channels); SB3's ``CnnPolicy`` takes (channels, height, width).
SB3 fixes that with ``VecTransposeImage`` around a gymnasium ``VecEnv``; here each agent's policy is built on the
transposed space and its observations are transposed on their way in, keeping the env and the buffers in
PettingZoo's layout. SB3's policies pick discrete actions as indices from 0; a ``Discrete(n, start=s)`` (or
``MultiDiscrete`` with ``start``) env takes ``s + index``, so the policies and buffers keep indices and the env gets
the offset ones.
"""

from __future__ import annotations

from typing import Any

import numpy as np
from gymnasium import spaces
from stable_baselines3.common.preprocessing import is_image_space, is_image_space_channels_first
from stable_baselines3.common.vec_env import VecTransposeImage


def _is_channel_last_image(space: spaces.Space) -> bool:
    return isinstance(space, spaces.Box) and is_image_space(space) and not is_image_space_channels_first(space)


def policy_observation_space(space: spaces.Space) -> spaces.Space:
    """The space an agent's policy is built on: ``space`` with channel-last images (also inside a Dict) transposed."""
    if isinstance(space, spaces.Dict):
        return spaces.Dict({key: policy_observation_space(sub) for key, sub in space.spaces.items()})
    if _is_channel_last_image(space):
        return VecTransposeImage.transpose_space(space)  # type: ignore[arg-type]
    return space


def to_env_action(actions: Any, space: spaces.Space) -> Any:
    """A policy's actions (indices from 0 for discrete spaces) as the env takes them: with the space's ``start``."""
    if isinstance(space, (spaces.Discrete, spaces.MultiDiscrete)) and np.any(space.start != 0):
        return np.asarray(actions) + space.start
    return actions


def to_policy_observation(obs: Any, space: spaces.Space) -> Any:
    """Observations of ``space`` (single or batched) in the layout of :func:`policy_observation_space`."""
    if isinstance(space, spaces.Dict):
        missing = [key for key in space.spaces if not isinstance(obs, dict) or key not in obs]
        if missing:
            found = sorted(obs) if isinstance(obs, dict) else type(obs).__name__
            raise ValueError(
                f"The observation lacks the entries {missing} of its Dict space (got {found}): pass it as the env gives it"
            )
        return {key: to_policy_observation(obs[key], sub) for key, sub in space.spaces.items()}
    if _is_channel_last_image(space):
        return np.moveaxis(obs, -1, -3)
    return obs
