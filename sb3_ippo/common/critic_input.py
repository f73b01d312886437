"""What MAPPO's centralized critic sees: the env's global state, or every agent's observation, beside each agent's own.

:class:`CriticInputWrapper` wraps one PettingZoo parallel env so that every agent's observation becomes
``{"obs": its own observation, "critic": the critic's input}``, computed by the env copy itself at every reset and
step. So the env layer needs no new path: the critic input travels with the observations through every kind of copy
(in this process, worker processes, Ray actors), is in ``final_obs`` when an episode is truncated (the bootstrap of
the truncated trajectory is V(critic input at the last step), taken before the copy resets), is stored in the
buffers with each agent's transitions, and is normalized with the observations (``normalize_obs``). The actor of a
MAPPO policy reads only ``"obs"`` (:mod:`sb3_ippo.mappo.policies`).

The critic's input (``CriticInput``):

- ``"state"``: the env's ``state()`` (its ``state_space``), as PettingZoo parallel envs such as mpe2's provide;
- ``"joint_obs"``: every agent's observation, flattened, in ``possible_agents`` order, then one alive flag per agent:
  an agent absent from the step (it left the episode, or has not spawned) has a zero-filled slot and flag 0;
- ``own_obs=True`` adds the agent's own observation, ``agent_id=True`` a one-hot of its index in ``possible_agents``
  (MAPPO's "agent-specific global state": with shared parameters, the critic then knows whose value it predicts).

Images (uint8, values 0-255: an agent's observation, or the state) enter the critic input divided by 255, as SB3's
policies scale the images the actor sees (``normalize_images``): the critic sees pixels on the actor's scale.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import numpy as np
from gymnasium import spaces
from pettingzoo.utils.wrappers import BaseParallelWrapper
from stable_baselines3.common.preprocessing import is_image_space

from sb3_ippo.common.type_aliases import AgentID

CriticInputKind = Literal["state", "joint_obs"]
CRITIC_INPUT_KINDS: tuple[CriticInputKind, ...] = ("state", "joint_obs")
OBS_KEY = "obs"
CRITIC_KEY = "critic"
# The critic is an MLP over a flat vector: a larger input (an image state, e.g. butterfly's 560x880x3 frames) would
# give every critic a first layer of millions of weights per hidden unit, which exhausts memory before training starts.
MAX_CRITIC_INPUT = 100_000


@dataclass(frozen=True)
class CriticInput:
    """What the centralized critic sees (see the module docstring).

    :param kind: ``"state"`` (the env's ``state()``) or ``"joint_obs"`` (every agent's observation and alive flag).
    :param own_obs: Add the agent's own observation.
    :param agent_id: Add a one-hot of the agent's index in ``possible_agents``.
    """

    kind: CriticInputKind = "state"
    own_obs: bool = False
    agent_id: bool = False

    def __post_init__(self) -> None:
        if self.kind not in CRITIC_INPUT_KINDS:
            raise ValueError(f"critic_input must be one of {CRITIC_INPUT_KINDS}, got {self.kind!r}")


def as_critic_input(value: CriticInput | str) -> CriticInput:
    """``value`` as a :class:`CriticInput` (a string is its ``kind``)."""
    if isinstance(value, CriticInput):
        return value
    if not isinstance(value, str):
        raise TypeError(f"critic_input must be 'state', 'joint_obs' or a CriticInput, got {value!r}")
    return CriticInput(value)  # type: ignore[arg-type]


def _flat_box(space: spaces.Space, what: str) -> int:
    if not isinstance(space, spaces.Box):
        raise ValueError(
            f"{what} is {space}: MAPPO's critic input is built from Box observations (and a Box state) only; "
            "use IPPO for other observation spaces"
        )
    return int(np.prod(space.shape, dtype=np.int64))


def _pixel_scale(space: spaces.Space) -> float:
    """What a value of ``space`` is multiplied by in the critic input: 1/255 for an image, as SB3's preprocessing scales
    the images a policy sees, else 1."""
    return 1.0 / 255.0 if is_image_space(space) else 1.0


def _flat(value: Any, scale: float = 1.0) -> np.ndarray:
    flat = np.asarray(value, dtype=np.float32).reshape(-1)
    return flat * np.float32(scale) if scale != 1.0 else flat


class CriticInputWrapper(BaseParallelWrapper):
    """A parallel env whose agents observe ``{"obs": own observation, "critic": the critic's input}``.

    :param env: A PettingZoo parallel env with Box observations.
    :param critic_input: What the critic sees: "state", "joint_obs" or a :class:`CriticInput`.
    :raises ValueError: with ``"state"``, for an env without ``state()`` / ``state_space`` (naming "joint_obs"); for an
        observation space that is not a Box.
    """

    def __init__(self, env: Any, critic_input: CriticInput | str = "state") -> None:
        super().__init__(env)
        self.critic_input = as_critic_input(critic_input)
        self._agents: list[AgentID] = list(env.possible_agents)
        self._own_spaces = {agent: env.observation_space(agent) for agent in self._agents}
        self._obs_sizes = {
            agent: _flat_box(space, f"Agent {agent!r}'s observation space") for agent, space in self._own_spaces.items()
        }
        self._obs_scales = {agent: _pixel_scale(space) for agent, space in self._own_spaces.items()}
        self._state_scale = 1.0
        size = 0
        if self.critic_input.kind == "state":
            state_space = _state_space(env)
            self._state_scale = _pixel_scale(state_space)
            size += _flat_box(state_space, "The env's state_space")
            source = f"the env's state(), {state_space.shape}"
        else:
            size += sum(self._obs_sizes.values()) + len(self._agents)
            source = "every agent's observation"
        self._critic_sizes = {
            agent: size
            + (self._obs_sizes[agent] if self.critic_input.own_obs else 0)
            + (len(self._agents) if self.critic_input.agent_id else 0)
            for agent in self._agents
        }
        largest = max(self._critic_sizes.values())
        if largest > MAX_CRITIC_INPUT:
            raise ValueError(
                f"MAPPO's critic input would be {largest:,} values ({source}), more than {MAX_CRITIC_INPUT:,}: its "
                "critics are MLPs over a flat vector, and each would need "
                f"{largest * 64 * 4 / 1e6:,.0f} MB for its first layer alone (64 units). Use IPPO (e.g. with "
                "'CnnPolicy' for images), or give the env a smaller state or smaller observations (e.g. SuperSuit's "
                "resize_v1 and color_reduction_v0 for images)"
            )
        # One-hot agent ids (critic_agent_id), made once rather than at every step.
        self._one_hots = dict(zip(self._agents, np.eye(len(self._agents), dtype=np.float32), strict=True))
        self._spaces = {
            agent: spaces.Dict(
                {
                    OBS_KEY: self._own_spaces[agent],
                    CRITIC_KEY: spaces.Box(-np.inf, np.inf, (self._critic_sizes[agent],), np.float32),
                }
            )
            for agent in self._agents
        }

    def observation_space(self, agent: AgentID) -> spaces.Space:
        return self._spaces[agent]

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        obs, infos = self.env.reset(seed=seed, options=options)
        return self._with_critic_input(obs), infos

    def step(self, actions: dict) -> tuple[dict, dict, dict, dict, dict]:
        obs, rewards, terminations, truncations, infos = self.env.step(actions)
        return self._with_critic_input(obs), rewards, terminations, truncations, infos

    def _shared_input(self, obs: dict[AgentID, Any]) -> np.ndarray:
        """The part every agent's critic input shares: the state, or the joint observation and alive flags."""
        if self.critic_input.kind == "state":
            return _flat(self.env.state(), self._state_scale)
        parts = [
            _flat(obs[agent], self._obs_scales[agent]) if agent in obs else np.zeros(self._obs_sizes[agent], np.float32)
            for agent in self._agents
        ]
        parts.append(np.array([agent in obs for agent in self._agents], dtype=np.float32))
        return np.concatenate(parts)

    def _with_critic_input(self, obs: dict[AgentID, Any]) -> dict[AgentID, dict[str, np.ndarray]]:
        shared = self._shared_input(obs) if obs else None
        wrapped = {}
        for agent, own in obs.items():
            parts = [shared]
            if self.critic_input.own_obs:
                parts.append(_flat(own, self._obs_scales[agent]))
            if self.critic_input.agent_id:
                parts.append(self._one_hots[agent])
            wrapped[agent] = {OBS_KEY: own, CRITIC_KEY: np.concatenate(parts)}  # type: ignore[arg-type]
        return wrapped


def _state_space(env: Any) -> spaces.Space:
    state_space = getattr(env, "state_space", None)
    if not isinstance(state_space, spaces.Space) or not callable(getattr(env, "state", None)):
        name = env.metadata.get("name", type(env).__name__) if isinstance(getattr(env, "metadata", None), dict) else env
        raise ValueError(
            f"critic_input='state' needs the env's global state (state() and state_space), which {name} does not "
            "provide: use critic_input='joint_obs' (every agent's observation, with an alive flag each)"
        )
    return state_space


def has_critic_input(observation_space: spaces.Space) -> bool:
    """Whether ``observation_space`` is one of :class:`CriticInputWrapper`'s (own observation and critic input)."""
    return isinstance(observation_space, spaces.Dict) and set(observation_space.spaces) == {OBS_KEY, CRITIC_KEY}
