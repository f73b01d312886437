"""The multi-agent algorithm as SB3's ``BaseAlgorithm`` is every algorithm's: the env and its agents, the policies,
``predict``, ``save`` and ``load``.

:class:`MultiAgentBaseAlgorithm` declares what a subclass's ``__init__`` sets (its hyperparameters and counters) and its
``_setup_model`` builds; :class:`sb3_ippo.common.on_policy_algorithm.MultiAgentOnPolicyAlgorithm` adds the training
loop.
"""

from __future__ import annotations

import io
import pathlib
from collections.abc import Iterable, Mapping
from types import MappingProxyType
from typing import Any, Literal, TypeVar

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.policies import ActorCriticPolicy, BasePolicy
from stable_baselines3.common.type_aliases import Schedule
from stable_baselines3.common.utils import set_random_seed as set_global_random_seed
from torch import nn

from sb3_ippo import serialization
from sb3_ippo.common.buffer import AgentEpisodeBuffer, VersionStamp
from sb3_ippo.common.checks import check_agent_spaces
from sb3_ippo.common.groups import AgentGroup
from sb3_ippo.common.normalization import ObservationNormalizer, ReturnNormalizer
from sb3_ippo.common.preprocessing import to_env_action
from sb3_ippo.common.type_aliases import AgentID
from sb3_ippo.games.self_play import FrozenSeats
from sb3_ippo.update.ppo import UpdateStats
from sb3_ippo.update.recurrent import PredictState, check_episode_start, check_predict_state, is_recurrent, predict_recurrent
from sb3_ippo.update.runners import GroupRunner, policy_input
from sb3_ippo.update.settings import UpdateSettings
from sb3_ippo.vec_env import MultiAgentVecEnv, as_multiagent_vec_env

SelfMultiAgentAlgorithm = TypeVar("SelfMultiAgentAlgorithm", bound="MultiAgentBaseAlgorithm")


class MultiAgentBaseAlgorithm(BaseAlgorithm):
    """The base of multi-agent algorithms on PettingZoo envs (see the module docstring). A subclass's ``__init__`` sets
    the attributes below (the hyperparameters and the counters) and its ``_setup_model`` builds the groups, policies,
    runners, trainer and buffers."""

    env: MultiAgentVecEnv | None  # type: ignore[assignment]
    # What the subclass's __init__ sets (its hyperparameters) and _setup_model builds.
    n_steps: int | None
    n_episodes: int | None
    max_version_lag: int
    version_stamp: VersionStamp
    rollout_len: int | None
    align_rollouts: bool
    max_episode_steps: int | None
    max_buffered_episodes: int | None
    async_training: bool | Literal["auto"]
    opponents: Mapping[AgentID, Any] | None
    policy_version: int
    stale_episodes_dropped: int
    rejected_episodes: int
    env_restarts: int
    episodes_lost: int
    obs_normalizers: dict[AgentID, ObservationNormalizer] | None
    return_normalizers: dict[AgentID, ReturnNormalizer] | None
    update_stats: dict[AgentID, UpdateStats]
    possible_agents: list[AgentID]
    observation_spaces: dict[AgentID, spaces.Space]
    action_spaces: dict[AgentID, spaces.Space]
    buffers: dict[AgentID, AgentEpisodeBuffer]
    _agents_seen: set[AgentID]
    _last_alive: dict[AgentID, np.ndarray] | None
    _policy_keys: dict[AgentID, str]
    _log_names: dict[AgentID, str]
    _agent_groups: dict[str, AgentGroup]
    _group_of: dict[AgentID, str]
    _group_log_names: dict[str, str]
    _runners: dict[str, GroupRunner]
    _seats: FrozenSeats | None
    _policies: nn.ModuleDict
    _update_settings: dict[str, UpdateSettings]
    clip_range_schedule: Schedule

    def _check_hyperparameters(self) -> None:
        """:raises ValueError: for the first hyperparameter (or combination) that is not valid."""
        raise NotImplementedError

    # ----------------------------------------------------------------------------------------------------------
    # Environment
    # ----------------------------------------------------------------------------------------------------------

    def _use_env(self, env: MultiAgentVecEnv) -> None:
        """Adopt ``env``: its agents and spaces define (or, once defined, must match) the model's."""
        check_agent_spaces(env.observation_spaces, env.action_spaces)
        self.env = env
        self.n_envs = env.num_envs
        self.possible_agents = list(env.possible_agents)
        self.observation_spaces = dict(env.observation_spaces)
        self.action_spaces = dict(env.action_spaces)
        self.observation_space = spaces.Dict(self.observation_spaces)
        self.action_space = spaces.Dict(self.action_spaces)
        if self.max_episode_steps is not None:
            env.max_episode_steps = self.max_episode_steps


    def get_env(self) -> MultiAgentVecEnv | None:  # type: ignore[override]
        return self.env

    def set_random_seed(self, seed: int | None = None) -> None:
        """Seed python, numpy and torch, every agent's action space, and the env copies (copy ``i``: ``seed + i``)."""
        if seed is None:
            return
        set_global_random_seed(seed, using_cuda=self.device.type == th.device("cuda").type)
        for index, agent in enumerate(self.possible_agents):
            self.action_spaces[agent].seed(seed + index)
        if self.env is not None:
            self.env.seed(seed)

    @property
    def groups(self) -> Mapping[str, list[AgentID]]:
        """Read-only mapping: group name -> its agent ids (see the ``groups`` parameter)."""
        return MappingProxyType({name: list(group.agents) for name, group in self._agent_groups.items()})

    @property
    def policies(self) -> Mapping[AgentID, ActorCriticPolicy]:
        """Read-only mapping: agent id -> that agent's ``ActorCriticPolicy``."""
        return MappingProxyType({agent: self._policies[self._policy_keys[agent]] for agent in self.possible_agents})  # type: ignore[misc]

    @property
    def policy(self) -> BasePolicy:  # type: ignore[override]
        """There is no single ``policy``: SB3 code that reads it gets an ``AttributeError`` that says where to look."""
        raise AttributeError(
            "IPPO has one policy per agent, not one model.policy: use model.policies[agent_id] "
            f"(agents: {getattr(self, 'possible_agents', [])}). wandb's WandbCallback(gradient_save_freq=...) reads it: "
            "use sb3_ippo.tracking.WandbCallback, which watches every agent's networks"
        )

    # ----------------------------------------------------------------------------------------------------------
    # Saving and loading
    # ----------------------------------------------------------------------------------------------------------

    def _excluded_save_params(self) -> list[str]:
        return [
            *super()._excluded_save_params(),
            "_policies",
            "buffers",
            "_last_obs",
            "_last_alive",
            "_last_episode_starts",
            "clip_range_schedule",
            "_update_in_flight",
            "_rollout_ended",
            "_learner",
            "_agent_groups",
            "_group_of",
            "_group_log_names",
            "_update_settings",
            "_runners",
            "_trainer",
            "_seats",
            "opponents",
        ]

    def _get_torch_save_params(self) -> tuple[list[str], list[str]]:
        optimizers = [f"_policies.{self._policy_keys[agent]}.optimizer" for agent in self.possible_agents]
        return ["_policies", *optimizers], []

    def save(
        self,
        path: str | pathlib.Path | io.BufferedIOBase,
        exclude: Iterable[str] | None = None,
        include: Iterable[str] | None = None,
        format: str | None = None,
    ) -> None:
        """Write the model to one file: a zip (SB3's format) or, for a ``.safetensors`` path or
        ``format="safetensors"``, a safetensors file that loads without running code (``docs/usage.md``).

        :param format: "zip", "safetensors", or None: from the file name (".safetensors" or else zip).
        :raises sb3_ippo.serialization.NotSerializableError: (safetensors) naming each attribute the format cannot
            hold, such as a callable schedule, and what to do instead.
        """
        format, path = serialization.resolve_save_format(path, format)
        if format == "safetensors":
            serialization.save_safetensors(self, path, exclude, include)
        else:
            serialization.save_zip(self, path, exclude, include)

    @classmethod
    def load(  # type: ignore[override]
        cls: type[SelfMultiAgentAlgorithm],
        path: str | pathlib.Path | io.BufferedIOBase,
        env: Any = None,
        device: th.device | str = "auto",
        custom_objects: dict[str, Any] | None = None,
        print_system_info: bool = False,
        force_reset: bool = True,
        trusted: bool = True,
        **kwargs: Any,
    ) -> SelfMultiAgentAlgorithm:
        """Load a model saved by :meth:`save`: every agent's weights and optimizer state, the normalization
        statistics, ``policy_version`` and the counters.

        :param env: The env to continue training on or to evaluate (same agents and spaces); None for ``predict``.
        :param trusted: For a zip: True unpickles its pickled entries as SB3 does, which runs any code the file
            names: only for files from a trusted source. False unpickles nothing, and refuses a zip with an entry
            that only unpickling could restore. A safetensors file never unpickles anything, whatever this says.
        :raises ModelFileError: (``sb3_ippo.serialization.ModelFileError``, a ValueError) if the file is damaged,
            crafted or not an IPPO model, naming the file and what is wrong. A file read without unpickling (safetensors,
            or ``trusted=False``) sets only the attributes the model saves, within ``serialization.MAX_SPACE_ELEMENTS``.
        :raises sb3_ippo.serialization.UntrustedContentError: (a ModelFileError) with ``trusted=False``, naming the
            entries that would need unpickling.
        :raises ValueError: if ``env``'s agents or spaces differ from the model's (naming the agent).
        """
        vec_env = None if env is None else as_multiagent_vec_env(env)
        return serialization.load_model(cls, path, vec_env, device, trusted, custom_objects, print_system_info, kwargs)

    # ----------------------------------------------------------------------------------------------------------
    # Inference
    # ----------------------------------------------------------------------------------------------------------

    def predict(  # type: ignore[override]
        self,
        observation: Mapping[AgentID, Any],
        state: Mapping[AgentID, PredictState] | None = None,
        episode_start: np.ndarray | Mapping[AgentID, np.ndarray] | None = None,
        deterministic: bool = False,
    ) -> tuple[dict[AgentID, np.ndarray], dict[AgentID, PredictState] | None]:
        """Actions for ``{agent_id: observation}`` (single or batched observations); agents missing from the
        dict are skipped. Observation normalization, if any, uses the frozen statistics.

        Recurrent agents follow SB3's recurrent convention (``RecurrentPPO.predict``), per agent: ``state`` is the
        dict of states the previous call returned (None at the start: zeros), ``episode_start`` says which rows start
        an episode (their state is reset): one array for every agent, or ``{agent_id: array}``.

        :return: ``({agent_id: action}, states)``; an action is batched where its observation is. ``states`` is None
            for a model without recurrent agents, else ``{agent_id: (hidden, cell)}`` for the recurrent agents given.
        :raises ValueError: for an observation that is not a dict, or an agent id the model does not know.
        """
        if not isinstance(observation, Mapping):
            raise ValueError(
                f"IPPO.predict takes a dict {{agent_id: observation}}, got {type(observation).__name__}; "
                f"the model's agents are {self.possible_agents}"
            )
        unknown = [agent for agent in observation if agent not in self._policy_keys]
        if unknown:
            raise ValueError(f"Unknown agent ids {unknown}: the model's agents are {self.possible_agents}")
        actions = {}
        states: dict[AgentID, PredictState] | None = None
        if any(is_recurrent(policy) for policy in self.policies.values()):
            check_predict_state(state)
            check_episode_start(episode_start, [agent for agent in observation if is_recurrent(self.policies[agent])])
            states = {}
        for agent, obs in observation.items():
            try:
                normalizer = None if self.obs_normalizers is None else self.obs_normalizers[agent]
                policy_obs = policy_input(obs, self.observation_spaces[agent], normalizer)
                policy = self.policies[agent]
                if is_recurrent(policy):
                    assert states is not None
                    action, states[agent] = predict_recurrent(
                        policy, agent, policy_obs, state, episode_start, deterministic  # type: ignore[arg-type]
                    )
                else:
                    action, _ = policy.predict(policy_obs, deterministic=deterministic)  # type: ignore[arg-type]
                actions[agent] = to_env_action(action, self.action_spaces[agent])
            except (ValueError, TypeError) as error:
                space = self.observation_spaces[agent]
                expected = f"{space.shape} or (n, *{space.shape})" if space.shape else f"an element of {space}"
                raise ValueError(
                    f"Agent {agent!r}: its observation (shape {np.shape(obs) if not isinstance(obs, Mapping) else 'dict'}) "
                    f"does not fit its observation space {space}; expected shape {expected}. ({error})"
                ) from error
        return actions, states
