"""Action masks: an observation Dict with an ``action_mask`` entry is masked, with sb3-contrib's maskable policies.

PettingZoo's turn-based games (the classic family) give every agent an observation ``{"observation": ...,
"action_mask": ...}``: the mask marks the legal moves. An agent whose observation space is such a Dict is *masked*:

- its policy is one of sb3-contrib's ``MaskableActorCriticPolicy`` classes, built on the observation *without* the
  mask (the ``"observation"`` entry, or a Dict of the other entries), with sb3-contrib's maskable distribution;
- the mask travels with the observation everywhere IPPO keeps observations (the episode buffer, the drained batch,
  every minibatch), and the policy takes it off on the way in (:class:`MaskedInputMixin`): so acting, the fresh
  log-prob recomputation and every update minibatch are masked, with no path that could forget it;
- ``predict`` never returns a masked action, and ``export_agent`` writes a zip that ``sb3_contrib.MaskablePPO.load``
  opens (its policy is the plain sb3-contrib class: the mixin adds no parameters).
"""

from __future__ import annotations

import copy
import functools
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from sb3_contrib.common.maskable.policies import (
    MaskableActorCriticCnnPolicy,
    MaskableActorCriticPolicy,
    MaskableMultiInputActorCriticPolicy,
)
from stable_baselines3.common.policies import (
    ActorCriticCnnPolicy,
    ActorCriticPolicy,
    BasePolicy,
    MultiInputActorCriticPolicy,
)
from stable_baselines3.common.preprocessing import is_image_space

MASK_KEY = "action_mask"
OBSERVATION_KEY = "observation"
MASKABLE_ACTION_SPACES = (spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)


def is_masked_space(space: spaces.Space) -> bool:
    """Whether observations of ``space`` carry an action mask: a Dict with an ``action_mask`` entry and others."""
    return isinstance(space, spaces.Dict) and MASK_KEY in space.spaces and len(space.spaces) > 1


def unmasked_space(space: spaces.Dict) -> spaces.Space:
    """What the policy of a masked agent sees: the ``observation`` entry, if it is the only other one, else a Dict of
    the entries other than the mask."""
    rest = {key: sub for key, sub in space.spaces.items() if key != MASK_KEY}
    if list(rest) == [OBSERVATION_KEY]:
        return rest[OBSERVATION_KEY]
    return spaces.Dict(rest)


def mask_size(action_space: spaces.Space) -> int:
    """The number of mask entries an action space takes: one per choice (per dimension, concatenated)."""
    if isinstance(action_space, spaces.Discrete):
        return int(action_space.n)
    if isinstance(action_space, spaces.MultiDiscrete):
        return int(np.sum(action_space.nvec))
    if isinstance(action_space, spaces.MultiBinary):
        return 2 * int(np.prod(action_space.shape))
    raise ValueError(
        f"Action masks need a Discrete, MultiDiscrete or MultiBinary action space, got {action_space}; "
        "remove the action_mask entry from the observation to train a continuous action space"
    )


def check_masked_agent(agent: Any, observation_space: spaces.Dict, action_space: spaces.Space) -> None:
    """Refuse a mask that cannot mask ``action_space``.

    :raises ValueError: naming the agent, the mask's shape and the shape its action space needs.
    """
    if not isinstance(action_space, MASKABLE_ACTION_SPACES):
        raise ValueError(
            f"Agent {agent!r} has an action_mask in its observation, but its action space {action_space} cannot be "
            "masked: action masks need Discrete, MultiDiscrete or MultiBinary actions"
        )
    if isinstance(action_space, spaces.MultiBinary) and len(action_space.shape) != 1:
        raise ValueError(f"Agent {agent!r}: sb3-contrib masks only one-dimensional MultiBinary actions, got {action_space}")
    mask_space = observation_space.spaces[MASK_KEY]
    expected = mask_size(action_space)
    if not isinstance(mask_space, (spaces.Box, spaces.MultiBinary)) or int(np.prod(mask_space.shape or ())) != expected:
        raise ValueError(
            f"Agent {agent!r}: its action_mask space {mask_space} does not fit its action space {action_space}, which "
            f"needs a mask of {expected} entries (one per choice)"
        )


def split_mask(obs: Any) -> tuple[Any, Any]:
    """``(observation without the mask, mask)`` for a masked observation (arrays or tensors, single or batched).

    :raises ValueError: for an observation without the mask.
    """
    if not isinstance(obs, dict) or MASK_KEY not in obs:
        found = f"a dict with keys {sorted(obs)}" if isinstance(obs, dict) else type(obs).__name__
        raise ValueError(
            f"This agent's policy is masked: its observations are dicts with an {MASK_KEY!r} entry (the legal moves), "
            f"as the env gives them; got {found}"
        )
    rest = {key: value for key, value in obs.items() if key != MASK_KEY}
    if list(rest) == [OBSERVATION_KEY]:
        return rest[OBSERVATION_KEY], obs[MASK_KEY]
    return rest, obs[MASK_KEY]


class MaskedInputMixin:
    """Takes the action mask off the observation at every entry point of a ``MaskableActorCriticPolicy`` and applies
    it: ``forward``, ``evaluate_actions``, ``get_distribution`` and ``predict``. The policy's networks see the rest of
    the observation (its ``observation_space`` is :func:`unmasked_space`). An explicit ``action_masks`` argument, as
    sb3-contrib passes it, is honoured too, with an unmasked observation."""

    def forward(
        self, obs: Any, deterministic: bool = False, action_masks: Any = None
    ) -> tuple[th.Tensor, th.Tensor, th.Tensor]:
        obs, action_masks = self._take_mask(obs, action_masks)
        return super().forward(obs, deterministic=deterministic, action_masks=action_masks)  # type: ignore[misc]

    def evaluate_actions(
        self, obs: Any, actions: th.Tensor, action_masks: Any = None
    ) -> tuple[th.Tensor, th.Tensor, th.Tensor | None]:
        obs, action_masks = self._take_mask(obs, action_masks)
        return super().evaluate_actions(obs, actions, action_masks=action_masks)  # type: ignore[misc]

    def get_distribution(self, obs: Any, action_masks: Any = None) -> Any:
        obs, action_masks = self._take_mask(obs, action_masks)
        return super().get_distribution(obs, action_masks=action_masks)  # type: ignore[misc]

    def predict_values(self, obs: Any) -> th.Tensor:
        obs, _ = self._take_mask(obs, None)
        return super().predict_values(obs)  # type: ignore[misc]

    def predict(
        self,
        observation: Any,
        state: tuple[np.ndarray, ...] | None = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = False,
        action_masks: np.ndarray | None = None,
    ) -> tuple[np.ndarray, tuple[np.ndarray, ...] | None]:
        observation, action_masks = self._take_mask(observation, action_masks)
        return super().predict(  # type: ignore[misc]
            observation, state, episode_start, deterministic=deterministic, action_masks=action_masks
        )

    def _take_mask(self, obs: Any, action_masks: Any) -> tuple[Any, Any]:
        if action_masks is not None and not (isinstance(obs, dict) and MASK_KEY in obs):
            return obs, action_masks
        return split_mask(obs)


class MaskedMlpPolicy(MaskedInputMixin, MaskableActorCriticPolicy):
    """sb3-contrib's ``MaskableActorCriticPolicy`` (``MaskablePPO``'s ``MlpPolicy``) on masked observations."""


class MaskedCnnPolicy(MaskedInputMixin, MaskableActorCriticCnnPolicy):
    """sb3-contrib's ``MaskableActorCriticCnnPolicy`` (``MaskablePPO``'s ``CnnPolicy``) on masked observations."""


class MaskedMultiInputPolicy(MaskedInputMixin, MaskableMultiInputActorCriticPolicy):
    """sb3-contrib's ``MaskableMultiInputActorCriticPolicy`` (``MaskablePPO``'s ``MultiInputPolicy``) on masked
    observations whose other entries form a Dict."""


@functools.cache
def _masked_subclass(policy_class: type[MaskableActorCriticPolicy]) -> type[BasePolicy]:
    """A user's own maskable policy, taking the mask off its observations (one class per user class)."""
    return type(policy_class.__name__, (MaskedInputMixin, policy_class), {"__module__": policy_class.__module__})


def masked_policy_class(policy_class: type[BasePolicy], observation_space: spaces.Dict, agent: Any) -> type[BasePolicy]:
    """The maskable policy a masked agent gets for the policy the user chose (``"MlpPolicy"``, ``"CnnPolicy"``,
    ``"MultiInputPolicy"`` or a ``MaskableActorCriticPolicy`` subclass), fitted to what it sees
    (:func:`unmasked_space`): a Dict of entries needs ``MultiInputPolicy``; an image may use either.

    :raises ValueError: for a policy class that cannot take masks (a plain ``ActorCriticPolicy`` subclass).
    """
    inner = unmasked_space(observation_space)
    if issubclass(policy_class, MaskedInputMixin):
        return policy_class
    if issubclass(policy_class, MaskableActorCriticPolicy):
        return _masked_subclass(policy_class)
    if isinstance(inner, spaces.Dict):
        return MaskedMultiInputPolicy
    if policy_class is ActorCriticPolicy or issubclass(policy_class, MultiInputActorCriticPolicy):
        # "MlpPolicy", or "MultiInputPolicy" as an SB3 user writes it for a Dict observation: the rest is one array.
        return MaskedMlpPolicy
    if issubclass(policy_class, ActorCriticCnnPolicy):
        if not is_image_space(inner, check_channels=False):
            raise ValueError(f"Agent {agent!r}: CnnPolicy needs an image observation entry, got {inner}")
        return MaskedCnnPolicy
    raise ValueError(
        f"Agent {agent!r} has an action_mask in its observation, and its policy {policy_class.__name__} cannot apply "
        "it: use 'MlpPolicy', 'CnnPolicy', 'MultiInputPolicy' or a sb3_contrib MaskableActorCriticPolicy subclass"
    )


def base_maskable_class(policy: MaskableActorCriticPolicy) -> type[MaskableActorCriticPolicy]:
    """The sb3-contrib class under a masked policy (what ``MaskablePPO`` loads without sb3_ippo installed)."""
    for cls in type(policy).__mro__:
        if issubclass(cls, MaskableActorCriticPolicy) and not issubclass(cls, MaskedInputMixin):
            return cls
    raise TypeError(f"{type(policy).__name__} is not a MaskableActorCriticPolicy")


def policy_for_agent(
    agent: Any, policy_class: type[BasePolicy], observation_space: spaces.Space, action_space: spaces.Space
) -> tuple[type[BasePolicy], spaces.Space]:
    """The policy class an agent gets and the observation space it is built on: for a masked agent, the maskable
    policy (:func:`masked_policy_class`) on the observation without the mask; otherwise ``policy_class`` unchanged on
    ``observation_space``.

    :raises ValueError: for a mask that does not fit the action space, or a policy that cannot take masks.
    """
    if not is_masked_space(observation_space):
        if issubclass(policy_class, MaskableActorCriticPolicy):
            raise ValueError(
                f"Agent {agent!r} has no action_mask in its observation space {observation_space}: "
                f"{policy_class.__name__} is for masked observations (an observation Dict with an 'action_mask' entry)"
            )
        return policy_class, observation_space
    assert isinstance(observation_space, spaces.Dict)
    check_masked_agent(agent, observation_space, action_space)
    return masked_policy_class(policy_class, observation_space, agent), unmasked_space(observation_space)


def unmasked_normalizer(normalizer: Any) -> Any:
    """An ``ObservationNormalizer`` of a masked agent as its policy sees observations (without the mask): the statistics
    of the ``observation`` entry alone when that is what the policy takes (for ``export_agent``)."""
    rms = normalizer.obs_rms
    if isinstance(rms, dict) and set(rms) <= {OBSERVATION_KEY}:
        view = copy.copy(normalizer)
        view.obs_rms = rms.get(OBSERVATION_KEY)
        return view
    return normalizer
