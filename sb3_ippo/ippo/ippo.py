"""IPPO: one SB3 ``ActorCriticPolicy`` per PettingZoo agent, trained by PPO on that agent's own trajectories."""

from __future__ import annotations

import copy
import functools
import io
import pathlib
import re
import sys
import time
from collections.abc import Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3 import PPO
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.policies import ActorCriticPolicy, BasePolicy, MultiInputActorCriticPolicy
from stable_baselines3.common.save_util import load_from_zip_file
from stable_baselines3.common.type_aliases import MaybeCallback, Schedule
from stable_baselines3.common.utils import FloatSchedule, obs_as_tensor, safe_mean
from stable_baselines3.common.utils import set_random_seed as set_global_random_seed
from torch import nn

from sb3_ippo import serialization
from sb3_ippo.buffer import AgentEpisodeBuffer, Trajectory
from sb3_ippo.export import fold_observation_normalization
from sb3_ippo.ippo.policies import CnnPolicy, MlpPolicy, MultiInputPolicy
from sb3_ippo.normalization import ObservationNormalizer, ReturnNormalizer
from sb3_ippo.preprocessing import policy_observation_space, to_policy_observation
from sb3_ippo.ppo_update import UpdateStats, build_batch, ppo_update
from sb3_ippo.vec_env import AgentID, MultiAgentStep, MultiAgentVecEnv, ObsArray, as_multiagent_vec_env

SelfIPPO = TypeVar("SelfIPPO", bound="IPPO")

# SB3's stdout logger truncates keys to 36 characters: per-agent keys are built to fit.
MAX_LOG_KEY_LENGTH = 36
_LONGEST_KEY_PARTS = len("rollout/") + len("/ep_rew_mean")


def _select_rows(obs: ObsArray, rows: np.ndarray) -> ObsArray:
    if isinstance(obs, dict):
        return {key: value[rows] for key, value in obs.items()}
    return obs[rows]


@dataclass
class UpdateJob:
    """One update's work: each agent's drained trajectories and the objects the update changes. In the calling thread
    these are the model's own; for a background update (``async_training``) they are copies, so that collection goes
    on with the model's policies (and observation statistics) meanwhile."""

    trajectories: dict[AgentID, list[Trajectory]]
    policies: dict[AgentID, ActorCriticPolicy]
    obs_normalizers: dict[AgentID, ObservationNormalizer] | None
    return_normalizers: dict[AgentID, ReturnNormalizer] | None
    progress_remaining: float
    clip_range: float
    clip_range_vf: float | None
    generator: th.Generator | None


def module_keys(agent_ids: list[AgentID]) -> dict[AgentID, str]:
    """Keys that ``nn.ModuleDict`` and SB3's dotted save names accept, one per agent id, unique and readable."""
    keys: dict[AgentID, str] = {}
    for index, agent in enumerate(agent_ids):
        key = "agent_" + re.sub(r"\W", "_", str(agent))
        if key in keys.values():
            key = f"{key}_{index}"
        keys[agent] = key
    return keys


def log_names(agent_ids: list[AgentID]) -> dict[AgentID, str]:
    """Agent names for per-agent logger keys: short enough that every key stays within 36 characters, unique."""
    width = MAX_LOG_KEY_LENGTH - _LONGEST_KEY_PARTS
    names = {agent: re.sub(r"[^\w.-]", "_", str(agent))[:width] for agent in agent_ids}
    if len(set(names.values())) < len(names):
        names = {agent: f"agent{index}" for index, agent in enumerate(agent_ids)}
    return names


class IPPO(BaseAlgorithm):
    """
    Independent Proximal Policy Optimization for PettingZoo multi-agent environments.

    Every agent id gets its own ``ActorCriticPolicy`` (own weights, own optimizer), built from that agent's
    observation and action spaces, and its own episode buffer. Collection runs all agents' policies on
    ``n_envs`` env copies; when every agent that has acted so far has enough finished trajectories, each
    agent's oldest trajectories are drained, their values and log-probs recomputed with the agent's current
    networks (fresh-value GAE, fresh log-probs), and the agent's policy is updated by PPO with a KL early stop.
    ``policy_version`` then advances by one. Trajectories collected by a policy more than ``max_version_lag``
    versions old are dropped and counted in ``stale_episodes_dropped``: stale data never trains.

    Largely identical to SB3's PPO in its losses (clipped surrogate, optional value clipping, entropy bonus,
    gradient clipping); it differs in what a batch is (whole trajectories, not fixed-length rollouts), in when
    values and log-probs are computed (at update time, by default) and in the early stop (checked before every
    gradient step, stopping all remaining passes of that agent). With ``async_training``, each update runs in a
    background thread while collection goes on with the previous policies (see the parameter).

    :param policy: The policy class of every agent: "MlpPolicy", "CnnPolicy", "MultiInputPolicy" or an
        ``ActorCriticPolicy`` subclass.
    :param env: A PettingZoo ``ParallelEnv``, an ``AECEnv`` that PettingZoo can run in parallel, or
        ``sb3_ippo.make_vec_env(...)``. None only when loading a model for prediction.
    :param learning_rate: The learning rate of every agent's Adam optimizer; a constant or a schedule of the
        remaining progress (from 1 to 0).
    :param n_steps: If set, an update is due once every agent that has acted has finished trajectories covering
        at least ``n_steps`` transitions (reference: ``min_steps_per_epoch``), and it drains just enough of the
        oldest ones; ``n_episodes`` is then ignored. None: count episodes.
    :param n_episodes: An update is due once every agent that has acted has ``n_episodes`` finished
        trajectories (reference: ``traj_per_epoch``), and it drains exactly that many, oldest first; the excess
        waits for the next update. With ``rollout_len``, each chunk counts as a trajectory.
    :param batch_size: Minibatch size, in transitions; None: the agent's whole batch is one minibatch.
    :param n_epochs: The maximum number of passes over an agent's batch (reference: ``train_pi_iters``).
    :param gamma: Discount factor.
    :param gae_lambda: GAE's bias/variance trade-off (reference: ``lam``).
    :param clip_range: PPO's clipping parameter; a constant or a schedule (reference: ``clip_ratio``).
    :param clip_range_vf: Clipping of the value-function change around the recomputed old values, on the
        value head's scale (normalized when ``normalize_returns``). None: no clipping.
    :param normalize_advantage: Normalize the advantages over each agent's batch.
    :param ent_coef: Entropy coefficient of the loss.
    :param vf_coef: Value-function coefficient of the loss.
    :param max_grad_norm: Gradient clipping norm (None: no clipping).
    :param target_kl: Before each gradient step, if the minibatch's approximate KL exceeds ``1.5 * target_kl``,
        that agent skips the step and stops all its remaining passes. None: no early stop.
    :param max_version_lag: A trajectory whose version is more than this many updates behind the current
        ``policy_version`` is stale: dropped at drain and counted. 0 keeps only data from the current policy.
    :param recompute_values: Recompute V(s) of the drained observations with the current value network before
        GAE (fresh-value GAE). False: the values stored at collection time are used (bootstrap values are
        always computed at update time, as they are never stored).
    :param recompute_log_prob: Recompute log pi_old(a|s) with the current policy before the first gradient
        step, so the first minibatch's ratio is exactly 1. Trade-off: the ratio then carries no importance
        correction for data collected by an older policy; ``max_version_lag`` bounds how old that data can be.
    :param shuffle_minibatches: Shuffle transitions before each pass. False (default) keeps stored order, so
        minibatches hold contiguous pieces of trajectories.
    :param normalize_obs: Keep per-agent running mean/std of observations (vector ``Box`` entries), updated
        during training, frozen in ``predict`` and evaluation, saved with the model.
    :param normalize_returns: Keep per-agent running statistics of the returns; the value head then predicts
        normalized returns, which are de-normalized before GAE.
    :param rollout_len: Cut an agent's trajectory every ``rollout_len`` steps; each chunk bootstraps from
        V(the next observation). None: trajectories are whole episodes.
    :param max_episode_steps: Truncate every episode after this many env steps (None: the env decides).
    :param max_buffered_episodes: Per agent, at most this many finished trajectories wait for an update; when
        full (after dropping stale ones), new trajectories are rejected and counted in ``rejected_episodes``.
        Without ``n_steps``, it must be at least ``n_episodes``, or no update could ever be due.
    :param async_training: Overlap each update with collection (the reference's background training thread).
        When an update is due, the drained trajectories are trained on copies of the policies in a background
        thread, while collection fills the next batch with the current policies; the trained weights are applied,
        and ``policy_version`` advances, when the next update is due. Every batch after the first was thus
        collected by the previous version (lag 1, so ``max_version_lag`` must be at least 1). Runs stay
        reproducible with a seed. Python's global interpreter lock limits the overlap: about 1.03-1.08x the
        synchronous speed on simple_spread with MLPs (``docs/algorithm.md``).
    :param stats_window_size: Window size for the rollout logging: episodes averaged for ``rollout/ep_rew_mean``.
    :param tensorboard_log: The log location for tensorboard (None: no tensorboard).
    :param policy_kwargs: Keyword arguments for every agent's policy, e.g. ``dict(net_arch=[64, 64])``.
    :param verbose: 0 no output, 1 training information, 2 debug.
    :param seed: Seed for the pseudo-random generators and the env copies (copy ``i`` gets ``seed + i``).
    :param device: Device (cpu, cuda, ...) on which the code should be run; "auto" picks cuda if available.
    :param _init_setup_model: Whether or not to build the networks on creation of the instance.
    """

    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {
        "MlpPolicy": MlpPolicy,
        "CnnPolicy": CnnPolicy,
        "MultiInputPolicy": MultiInputPolicy,
    }
    env: MultiAgentVecEnv | None  # type: ignore[assignment]

    def __init__(
        self,
        policy: str | type[ActorCriticPolicy],
        env: Any,
        learning_rate: float | Schedule = 3e-4,
        n_steps: int | None = None,
        n_episodes: int = 8,
        batch_size: int | None = None,
        n_epochs: int = 80,
        gamma: float = 0.99,
        gae_lambda: float = 0.97,
        clip_range: float | Schedule = 0.2,
        clip_range_vf: float | Schedule | None = None,
        normalize_advantage: bool = True,
        ent_coef: float = 0.0,
        vf_coef: float = 0.5,
        max_grad_norm: float | None = 0.5,
        target_kl: float | None = 0.02,
        max_version_lag: int = 1,
        recompute_values: bool = True,
        recompute_log_prob: bool = True,
        shuffle_minibatches: bool = False,
        normalize_obs: bool = False,
        normalize_returns: bool = True,
        rollout_len: int | None = None,
        max_episode_steps: int | None = None,
        max_buffered_episodes: int | None = None,
        async_training: bool = False,
        stats_window_size: int = 100,
        tensorboard_log: str | None = None,
        policy_kwargs: dict[str, Any] | None = None,
        verbose: int = 0,
        seed: int | None = None,
        device: th.device | str = "auto",
        _init_setup_model: bool = True,
    ) -> None:
        if isinstance(policy, type) and not issubclass(policy, ActorCriticPolicy):
            raise TypeError(
                f"policy must be an ActorCriticPolicy subclass or one of {list(self.policy_aliases)}, got {policy}"
            )
        super().__init__(
            policy=policy,
            env=None,
            learning_rate=learning_rate,
            policy_kwargs=policy_kwargs,
            stats_window_size=stats_window_size,
            tensorboard_log=tensorboard_log,
            verbose=verbose,
            device=device,
            support_multi_env=True,
            seed=seed,
        )
        self.n_steps = n_steps
        self.n_episodes = n_episodes
        self.batch_size = batch_size
        self.n_epochs = n_epochs
        self.gamma = gamma
        self.gae_lambda = gae_lambda
        self.clip_range = clip_range
        self.clip_range_vf = clip_range_vf
        self.normalize_advantage = normalize_advantage
        self.ent_coef = ent_coef
        self.vf_coef = vf_coef
        self.max_grad_norm = max_grad_norm
        self.target_kl = target_kl
        self.max_version_lag = max_version_lag
        self.recompute_values = recompute_values
        self.recompute_log_prob = recompute_log_prob
        self.shuffle_minibatches = shuffle_minibatches
        self.normalize_obs = normalize_obs
        self.normalize_returns = normalize_returns
        self.rollout_len = rollout_len
        self.max_episode_steps = max_episode_steps
        self.max_buffered_episodes = max_buffered_episodes
        self.async_training = async_training

        self.policy_version = 0
        self.stale_episodes_dropped = 0
        self.rejected_episodes = 0
        self.env_restarts = 0
        self.episodes_lost = 0
        self.obs_normalizers: dict[AgentID, ObservationNormalizer] | None = None
        self.return_normalizers: dict[AgentID, ReturnNormalizer] | None = None
        self._agents_seen: set[AgentID] = set()
        self._last_alive: dict[AgentID, np.ndarray] | None = None
        self.update_stats: dict[AgentID, UpdateStats] = {}
        self._update_in_flight: tuple[UpdateJob, Future[dict[AgentID, UpdateStats]]] | None = None

        if _init_setup_model:
            self._check_hyperparameters()
            if env is None:
                raise ValueError(
                    "IPPO needs an environment to build one policy per agent: pass a PettingZoo ParallelEnv, an "
                    "AECEnv or sb3_ippo.make_vec_env(...). To use a saved model without one, call IPPO.load(path)."
                )
            self._use_env(as_multiagent_vec_env(env))
            self._setup_model()

    def _check_hyperparameters(self) -> None:
        positive = {"n_episodes": self.n_episodes, "n_epochs": self.n_epochs}
        optional_positive = {
            "n_steps": self.n_steps,
            "batch_size": self.batch_size,
            "rollout_len": self.rollout_len,
            "max_episode_steps": self.max_episode_steps,
            "max_buffered_episodes": self.max_buffered_episodes,
        }
        for name, value in {**positive, **optional_positive}.items():
            if value is None and name in optional_positive:
                continue
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                none = " or None" if name in optional_positive else ""
                raise ValueError(f"{name} must be a positive integer{none}, got {value!r}")
        if not isinstance(self.max_version_lag, (int, np.integer)) or self.max_version_lag < 0:
            raise ValueError(f"max_version_lag must be a non-negative integer, got {self.max_version_lag!r}")
        if self.n_steps is None and self.max_buffered_episodes is not None and self.max_buffered_episodes < self.n_episodes:
            # No update could ever be due: collection would reject trajectories forever.
            raise ValueError(
                f"max_buffered_episodes ({self.max_buffered_episodes}) must be at least n_episodes ({self.n_episodes})"
            )
        if self.async_training and self.max_version_lag < 1:
            raise ValueError(
                "async_training collects each batch with the previous policy version, which max_version_lag=0 would "
                "drop as stale: use max_version_lag >= 1 or async_training=False"
            )
        if self.target_kl is not None and self.target_kl <= 0:
            raise ValueError(f"target_kl must be positive or None, got {self.target_kl}")
        if not 0.0 <= self.gamma <= 1.0 or not 0.0 <= self.gae_lambda <= 1.0:
            raise ValueError(f"gamma and gae_lambda must lie in [0, 1], got gamma={self.gamma}, gae_lambda={self.gae_lambda}")

    # ----------------------------------------------------------------------------------------------------------
    # Environment
    # ----------------------------------------------------------------------------------------------------------

    def _check_agent_spaces(self, observation_spaces: Mapping, action_spaces: Mapping) -> None:
        policy_name = self.policy_class.__name__
        for agent, action_space in action_spaces.items():
            if not isinstance(action_space, (spaces.Box, spaces.Discrete, spaces.MultiDiscrete, spaces.MultiBinary)):
                raise ValueError(
                    f"Agent {agent!r} has action space {action_space}; "
                    "IPPO supports Box, Discrete, MultiDiscrete and MultiBinary action spaces"
                )
            if isinstance(action_space, spaces.Box) and not np.all(np.isfinite([action_space.low, action_space.high])):
                raise ValueError(f"Agent {agent!r} has a Box action space with infinite bounds: {action_space}")
            if isinstance(observation_spaces[agent], spaces.Dict) and not issubclass(
                self.policy_class, MultiInputActorCriticPolicy
            ):
                raise ValueError(f"Agent {agent!r} has a Dict observation space: use 'MultiInputPolicy', not {policy_name}")
            if issubclass(self.policy_class, MultiInputActorCriticPolicy) and not isinstance(
                observation_spaces[agent], spaces.Dict
            ):
                # Otherwise SB3's CombinedExtractor fails with an AttributeError on the space.
                raise ValueError(
                    f"Agent {agent!r} has the observation space {observation_spaces[agent]}, not a Dict: {policy_name} "
                    "('MultiInputPolicy') needs Dict observations for every agent"
                )

    def _use_env(self, env: MultiAgentVecEnv) -> None:
        """Adopt ``env``: its agents and spaces define (or, once defined, must match) the model's."""
        self._check_agent_spaces(env.observation_spaces, env.action_spaces)
        self.env = env
        self.n_envs = env.num_envs
        self.possible_agents = list(env.possible_agents)
        self.observation_spaces = dict(env.observation_spaces)
        self.action_spaces = dict(env.action_spaces)
        self.observation_space = spaces.Dict(self.observation_spaces)
        self.action_space = spaces.Dict(self.action_spaces)
        if self.max_episode_steps is not None:
            env.max_episode_steps = self.max_episode_steps

    def _check_env_matches(self, env: MultiAgentVecEnv) -> None:
        if list(env.possible_agents) != list(self.possible_agents):
            missing = [agent for agent in self.possible_agents if agent not in env.possible_agents]
            extra = [agent for agent in env.possible_agents if agent not in self.possible_agents]
            culprit = next(iter(missing + extra), None)
            raise ValueError(
                f"The env's agents differ from the model's at agent {culprit!r}: the model has {self.possible_agents}, "
                f"the env has {list(env.possible_agents)}"
            )
        for agent in self.possible_agents:
            for kind, model_space, env_space in (
                ("observation", self.observation_spaces[agent], env.observation_spaces[agent]),
                ("action", self.action_spaces[agent], env.action_spaces[agent]),
            ):
                if model_space != env_space:
                    raise ValueError(
                        f"Agent {agent!r}: the env's {kind} space {env_space} differs from the model's {model_space}"
                    )

    def set_env(self, env: Any, force_reset: bool = True) -> None:
        """Use a new env (same agents and spaces). Finished trajectories waiting for an update are kept.

        :raises ValueError: naming the first agent whose id or spaces differ.
        """
        vec_env = as_multiagent_vec_env(env)
        self._check_env_matches(vec_env)
        self._use_env(vec_env)
        if force_reset:
            self._last_obs = None
        if hasattr(self, "buffers"):
            self._make_buffers()

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

    # ----------------------------------------------------------------------------------------------------------
    # Model
    # ----------------------------------------------------------------------------------------------------------

    def _setup_model(self) -> None:
        self._setup_lr_schedule()
        self.set_random_seed(self.seed)
        self.clip_range_schedule = FloatSchedule(self.clip_range)
        self.clip_range_vf_schedule = None if self.clip_range_vf is None else FloatSchedule(self.clip_range_vf)
        self._policy_keys = module_keys(self.possible_agents)
        self._log_names = log_names(self.possible_agents)
        self._policies = nn.ModuleDict(
            {
                self._policy_keys[agent]: self.policy_class(  # type: ignore[misc]
                    policy_observation_space(self.observation_spaces[agent]),
                    self.action_spaces[agent],
                    self.lr_schedule,
                    **self.policy_kwargs,
                ).to(self.device)
                for agent in self.possible_agents
            }
        )
        if self.normalize_obs and self.obs_normalizers is None:
            self.obs_normalizers = {
                agent: ObservationNormalizer(self.observation_spaces[agent]) for agent in self.possible_agents
            }
        if self.normalize_returns and self.return_normalizers is None:
            self.return_normalizers = {agent: ReturnNormalizer() for agent in self.possible_agents}
        self._make_buffers()

    def _make_buffers(self) -> None:
        """(Re)build the per-agent buffers for ``n_envs`` copies, keeping any finished trajectories."""
        old = getattr(self, "buffers", {})
        self.buffers = {
            agent: AgentEpisodeBuffer(self.n_envs, self.rollout_len, self.max_buffered_episodes)
            for agent in self.possible_agents
        }
        for agent, buffer in old.items():
            self.buffers[agent].finished = buffer.finished

    @property
    def policies(self) -> Mapping[AgentID, ActorCriticPolicy]:
        """Read-only mapping: agent id -> that agent's ``ActorCriticPolicy``."""
        return MappingProxyType({agent: self._policies[self._policy_keys[agent]] for agent in self.possible_agents})  # type: ignore[misc]

    def _excluded_save_params(self) -> list[str]:
        return [
            *super()._excluded_save_params(),
            "_policies",
            "buffers",
            "_last_obs",
            "_last_alive",
            "_last_episode_starts",
            "clip_range_schedule",
            "clip_range_vf_schedule",
            "_update_in_flight",
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
        cls: type[SelfIPPO],
        path: str | pathlib.Path | io.BufferedIOBase,
        env: Any = None,
        device: th.device | str = "auto",
        custom_objects: dict[str, Any] | None = None,
        print_system_info: bool = False,
        force_reset: bool = True,
        trusted: bool = True,
        **kwargs: Any,
    ) -> SelfIPPO:
        """Load a model saved by :meth:`save`: every agent's weights and optimizer state, the normalization
        statistics, ``policy_version`` and the counters.

        :param env: The env to continue training on or to evaluate (same agents and spaces); None for ``predict``.
        :param trusted: For a zip: True unpickles its pickled entries as SB3 does, which runs any code the file
            names: only for files from a trusted source. False unpickles nothing, and refuses a zip with an entry
            that only unpickling could restore. A safetensors file never unpickles anything, whatever this says.
        :raises ValueError: if the file is not an IPPO model, or ``env``'s agents or spaces differ (naming the agent).
        :raises sb3_ippo.serialization.UntrustedContentError: with ``trusted=False``, naming the entries that would
            need unpickling.
        """
        data: dict[str, Any] | None
        safetensors_path = serialization.safetensors_file(path)
        if safetensors_path is not None:
            data, params = serialization.load_safetensors(safetensors_path)
        elif not trusted:
            data, params = serialization.load_zip_untrusted(path, device=device)
        else:
            data, params, _ = load_from_zip_file(
                path, device=device, custom_objects=custom_objects, print_system_info=print_system_info
            )
            if data is not None:
                data.pop(serialization.JSON_STATE_KEY, None)
        if data is None or params is None or "possible_agents" not in data or "_policies" not in params:
            raise ValueError(f"{path} is not an IPPO model: it holds no per-agent policies")
        if "policy_kwargs" in kwargs and kwargs["policy_kwargs"] != data["policy_kwargs"]:
            raise ValueError(
                f"The specified policy kwargs {kwargs['policy_kwargs']} differ from the stored ones {data['policy_kwargs']}"
            )
        data["policy_kwargs"].pop("device", None)
        model = cls(policy=data["policy_class"], env=None, device=device, _init_setup_model=False)
        model.__dict__.update(data)
        model.__dict__.update(kwargs)
        if env is not None:
            vec_env = as_multiagent_vec_env(env)
            model._check_env_matches(vec_env)
            model._use_env(vec_env)
        model._setup_model()
        model.set_parameters(params, exact_match=True, device=device)
        return model

    # ----------------------------------------------------------------------------------------------------------
    # Training: collect -> drain -> recompute values -> GAE -> update -> apply
    # ----------------------------------------------------------------------------------------------------------

    def learn(
        self: SelfIPPO,
        total_timesteps: int,
        callback: MaybeCallback = None,
        log_interval: int = 1,
        tb_log_name: str = "IPPO",
        reset_num_timesteps: bool = True,
        progress_bar: bool = False,
    ) -> SelfIPPO:
        """Train for ``total_timesteps`` env steps (one joint step of one env copy counts 1).

        Collection stops once the budget is spent, even between updates: trajectories collected since the last
        update stay in the buffers, and ``learn(..., reset_num_timesteps=False)`` carries on with them.
        """
        if self.env is None:
            raise ValueError(
                "No environment to learn on: pass one to IPPO(...), IPPO.load(path, env=...) or model.set_env(env)"
            )
        self._check_hyperparameters()
        previous_obs = self._last_obs
        total_timesteps, callback = self._setup_learn(
            total_timesteps, callback, reset_num_timesteps, tb_log_name, progress_bar
        )
        if self._last_obs is not previous_obs:
            # The env copies were reset: the trajectories in progress cannot continue.
            for buffer in self.buffers.values():
                self.episodes_lost += buffer.drop_open()
            self._last_alive = self.env.alive
        iteration = 0
        callback.on_training_start(locals(), globals())
        executor = ThreadPoolExecutor(1, thread_name_prefix="ippo-update") if self.async_training else None
        try:
            while self.num_timesteps < total_timesteps:
                if not self.collect_rollouts(self.env, callback, total_timesteps):
                    break
                if not self._update_due():
                    break  # The budget ran out before an update was due.
                if self._finish_update_in_flight() and not self._update_due():
                    continue  # The new version made waiting trajectories stale: collect more.
                self._update_current_progress_remaining(self.num_timesteps, total_timesteps)
                if executor is None:
                    self.train()
                else:
                    job = self._prepare_update(background=True)
                    self._update_in_flight = (job, executor.submit(self._run_update, job))
                iteration += 1
                if log_interval is not None and iteration % log_interval == 0:
                    self.dump_logs(iteration)
        except BaseException:
            self._after_interruption()
            raise
        finally:
            finished_last = self._finish_update_in_flight()
            if executor is not None:
                executor.shutdown()
        if finished_last and log_interval is not None:
            self.dump_logs(iteration)
        callback.on_training_end()
        return self

    def _after_interruption(self) -> None:
        """Leave the model consistent after an exception or Ctrl-C inside ``learn``: it may have struck in the middle of
        a vectorized step, so the trajectories in progress are dropped (counted in ``episodes_lost``) and the next
        ``learn`` resets the env copies. Finished trajectories stay for the next update."""
        for buffer in self.buffers.values():
            self.episodes_lost += buffer.drop_open()
        self._last_obs = None

    def _update_due(self) -> bool:
        """An update is due when every agent that has acted so far has enough fresh finished trajectories."""
        return bool(self._agents_seen) and all(
            self.buffers[agent].is_ready(self.n_episodes, self.n_steps, self.policy_version, self.max_version_lag)
            for agent in self._agents_seen
        )

    def _policy_input(
        self, agent: AgentID, obs: ObsArray, obs_normalizers: Mapping[AgentID, ObservationNormalizer] | None = None
    ) -> ObsArray:
        """Raw observations (single or batched) as the agent's policy takes them: normalized with the statistics
        of ``obs_normalizers`` (default: the model's; frozen here), images channel-first."""
        normalizers = self.obs_normalizers if obs_normalizers is None else obs_normalizers
        if normalizers is not None:
            obs = normalizers[agent].normalize(obs)
        return to_policy_observation(obs, self.observation_spaces[agent])

    def _act(self, agent: AgentID, obs: ObsArray, alive: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sample actions for every row of ``obs`` with the agent's policy: actions, values, log-probs."""
        if self.obs_normalizers is not None:
            self.obs_normalizers[agent].update(_select_rows(obs, alive))
        with th.no_grad():
            actions, values, log_probs = self.policies[agent](obs_as_tensor(self._policy_input(agent, obs), self.device))
        return actions.cpu().numpy(), values.flatten().cpu().numpy(), log_probs.cpu().numpy()

    def _env_actions(self, agent: AgentID, actions: np.ndarray) -> np.ndarray:
        action_space = self.action_spaces[agent]
        if isinstance(action_space, spaces.Box):
            policy = self.policies[agent]
            if policy.squash_output:
                return policy.unscale_action(actions)
            return np.clip(actions, action_space.low, action_space.high)
        return actions

    def collect_rollouts(self, env: MultiAgentVecEnv, callback: BaseCallback, total_timesteps: int) -> bool:  # type: ignore[override]
        """Step the env copies with every agent's policy until an update is due or the budget is spent.

        Each agent's transitions go to its own buffer, stamped with ``policy_version``. Callbacks' ``on_step``
        runs once per vectorized step, after the step's data is stored; it returning False stops training.

        :return: False if a callback stopped training.
        """
        assert self._last_obs is not None and self._last_alive is not None
        for policy in self.policies.values():
            policy.set_training_mode(False)
        callback.on_rollout_start()
        continue_training = True
        while continue_training and not self._update_due() and self.num_timesteps < total_timesteps:
            obs: dict[AgentID, ObsArray] = self._last_obs  # type: ignore[assignment]
            alive = self._last_alive
            acting = [agent for agent in self.possible_agents if alive[agent].any()]
            sampled = {agent: self._act(agent, obs[agent], alive[agent]) for agent in acting}
            step = env.step_agents({agent: self._env_actions(agent, sampled[agent][0]) for agent in acting})
            self.num_timesteps += env.num_envs
            recorded = self._handle_env_restarts(step)

            for agent in acting:
                actions, values, log_probs = sampled[agent]
                self.buffers[agent].add(
                    alive[agent] & recorded,
                    obs[agent],
                    actions,
                    step.rewards[agent],
                    values,
                    log_probs,
                    step.terminations[agent],
                    step.truncations[agent],
                    step.obs[agent],
                    step.final_obs[agent],
                    self.policy_version,
                    self.max_version_lag,
                )
                self._agents_seen.add(agent)
            self._count_dropped_episodes()

            # What SB3 callbacks read from `locals`.
            new_obs, dones, infos = step.obs, step.dones, step.infos
            agent_rewards = step.rewards
            rewards = np.sum([step.rewards[agent] for agent in acting], axis=0)
            self._update_info_buffer(infos, dones)
            self._last_obs = new_obs  # type: ignore[assignment]
            self._last_alive = step.alive
            self._last_episode_starts = dones
            callback.update_locals(locals())
            continue_training = callback.on_step()

        callback.on_rollout_end()
        return continue_training

    def _handle_env_restarts(self, step: MultiAgentStep) -> np.ndarray:
        """Count the env copies restarted in ``step`` and drop the trajectories their lost episodes left open, which
        are never trained on. Returns which rows of ``step`` are transitions (not those of a lost episode)."""
        self.env_restarts += sum(bool(info.get("env_restarted")) for info in step.infos)
        if step.restarted is None or not step.restarted.any():
            return np.ones(len(step.dones), dtype=bool)
        for env_idx in np.flatnonzero(step.restarted).tolist():
            for buffer in self.buffers.values():
                self.episodes_lost += buffer.drop_open(env_idx)
        return ~step.restarted

    def _count_dropped_episodes(self) -> None:
        for buffer in self.buffers.values():
            self.stale_episodes_dropped += buffer.stale_episodes_dropped
            self.rejected_episodes += buffer.rejected_episodes
            buffer.stale_episodes_dropped = buffer.rejected_episodes = 0

    def train(self) -> None:
        """Drain each agent's oldest trajectories and update its policy on them; then ``policy_version`` advances.
        (Runs in the calling thread; ``learn`` with ``async_training`` runs the same steps with the middle one in
        the background.)"""
        job = self._prepare_update(background=False)
        self._apply_update(job, self._run_update(job))

    def _prepare_update(self, background: bool) -> UpdateJob:
        """Drain the batches (dropping stale trajectories) and set the learning rate and clip ranges; for an update
        that will run in the ``background``, copy what it will change."""
        progress = self._current_progress_remaining
        self._update_learning_rate([policy.optimizer for policy in self.policies.values()])
        trajectories = {}
        for agent in self.possible_agents:
            drained = self.buffers[agent].drain(self.n_episodes, self.n_steps, self.policy_version, self.max_version_lag)
            if drained:
                trajectories[agent] = drained
        self._count_dropped_episodes()
        policies = {agent: self.policies[agent] for agent in trajectories}
        obs_normalizers, return_normalizers = self.obs_normalizers, self.return_normalizers
        if background:
            # One deepcopy, so that each copied optimizer holds its copied policy's parameters.
            policies, obs_normalizers, return_normalizers = copy.deepcopy((policies, obs_normalizers, return_normalizers))
        generator = None
        if self.shuffle_minibatches:
            # Drawn here, in the collecting thread, so that a background update leaves torch's global RNG alone.
            generator = th.Generator().manual_seed(int(th.randint(2**62, (1,)).item()))
        return UpdateJob(
            trajectories=trajectories,
            policies=policies,
            obs_normalizers=obs_normalizers,
            return_normalizers=return_normalizers,
            progress_remaining=progress,
            clip_range=self.clip_range_schedule(progress),
            clip_range_vf=None if self.clip_range_vf_schedule is None else self.clip_range_vf_schedule(progress),
            generator=generator,
        )

    def _run_update(self, job: UpdateJob) -> dict[AgentID, UpdateStats]:
        """Each agent's batch (fresh values and log-probs, GAE) and PPO update. It touches only the job's objects,
        so it may run in a background thread."""
        stats = {}
        for agent, trajectories in job.trajectories.items():
            policy = job.policies[agent]
            batch = build_batch(
                policy,
                trajectories,
                gamma=self.gamma,
                gae_lambda=self.gae_lambda,
                recompute_values=self.recompute_values,
                recompute_log_prob=self.recompute_log_prob,
                preprocess_obs=functools.partial(self._policy_input, agent, obs_normalizers=job.obs_normalizers),
                return_normalizer=None if job.return_normalizers is None else job.return_normalizers[agent],
            )
            stats[agent] = ppo_update(
                policy,
                batch,
                n_epochs=self.n_epochs,
                batch_size=self.batch_size,
                clip_range=job.clip_range,
                clip_range_vf=job.clip_range_vf,
                normalize_advantage=self.normalize_advantage,
                ent_coef=self.ent_coef,
                vf_coef=self.vf_coef,
                max_grad_norm=self.max_grad_norm,
                target_kl=self.target_kl,
                shuffle_minibatches=self.shuffle_minibatches,
                generator=job.generator,
            )
        return stats

    def _apply_update(self, job: UpdateJob, stats: dict[AgentID, UpdateStats]) -> None:
        """Install the job's results (weights and optimizer states, when it trained copies), advance
        ``policy_version`` and record the update's statistics."""
        for agent, trained in job.policies.items():
            policy = self.policies[agent]
            if trained is not policy:
                policy.load_state_dict(trained.state_dict())
                policy.optimizer.load_state_dict(trained.optimizer.state_dict())
        self.return_normalizers = job.return_normalizers
        self.update_stats = stats
        self.policy_version += 1
        self._n_updates += 1
        self._record_update(job)

    def _finish_update_in_flight(self) -> bool:
        """Wait for the background update, if one runs, and apply it. Returns whether there was one."""
        if self._update_in_flight is None:
            return False
        job, future = self._update_in_flight
        self._update_in_flight = None
        self._apply_update(job, future.result())
        return True

    def _record_update(self, job: UpdateJob) -> None:
        stats = list(self.update_stats.values())
        if stats:
            for name in (
                "policy_loss",
                "policy_loss_delta",
                "value_loss",
                "value_loss_delta",
                "approx_kl",
                "entropy_loss",
                "clip_fraction",
                "explained_variance",
                "n_epochs_run",
            ):
                self.logger.record(f"train/{name}", float(np.mean([getattr(s, name) for s in stats])))
        for agent, agent_stats in self.update_stats.items():
            prefix = f"train/{self._log_names[agent]}/"
            for name in ("policy_loss", "value_loss", "approx_kl", "entropy_loss", "clip_fraction", "n_epochs_run"):
                self.logger.record(prefix + name, getattr(agent_stats, name))
            self.logger.record(prefix + "n_transitions", agent_stats.n_transitions)
        self.logger.record("train/policy_version", self.policy_version)
        self.logger.record("train/n_updates", self._n_updates, exclude="tensorboard")
        self.logger.record("train/learning_rate", self.lr_schedule(job.progress_remaining))
        self.logger.record("train/clip_range", job.clip_range)
        self.logger.record("rollout/stale_episodes_dropped", self.stale_episodes_dropped)
        self.logger.record("rollout/env_restarts", self.env_restarts)
        self.logger.record("rollout/episodes_lost", self.episodes_lost)
        if self.max_buffered_episodes is not None:
            self.logger.record("rollout/rejected_episodes", self.rejected_episodes)

    def dump_logs(self, iteration: int = 0) -> None:
        """Write the rollout and time statistics, with the last update's, to the logger (SB3's on-policy layout)."""
        assert self.ep_info_buffer is not None
        time_elapsed = max((time.time_ns() - self.start_time) / 1e9, sys.float_info.epsilon)
        fps = int((self.num_timesteps - self._num_timesteps_at_start) / time_elapsed)
        if iteration > 0:
            self.logger.record("time/iterations", iteration, exclude="tensorboard")
        if len(self.ep_info_buffer) > 0:
            self.logger.record("rollout/ep_rew_mean", safe_mean([info["r"] for info in self.ep_info_buffer]))
            self.logger.record("rollout/ep_len_mean", safe_mean([info["l"] for info in self.ep_info_buffer]))
            for agent in self.possible_agents:
                returns = [
                    info["agent_returns"][agent] for info in self.ep_info_buffer if agent in info.get("agent_returns", {})
                ]
                if returns:
                    self.logger.record(f"rollout/{self._log_names[agent]}/ep_rew_mean", safe_mean(returns))
        self.logger.record("time/fps", fps)
        self.logger.record("time/time_elapsed", int(time_elapsed), exclude="tensorboard")
        self.logger.record("time/total_timesteps", self.num_timesteps, exclude="tensorboard")
        self.logger.dump(step=self.num_timesteps)

    # ----------------------------------------------------------------------------------------------------------
    # Inference and export
    # ----------------------------------------------------------------------------------------------------------

    def predict(  # type: ignore[override]
        self,
        observation: Mapping[AgentID, Any],
        state: tuple[np.ndarray, ...] | None = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = False,
    ) -> tuple[dict[AgentID, np.ndarray], None]:
        """Actions for ``{agent_id: observation}`` (single or batched observations); agents missing from the
        dict are skipped. Observation normalization, if any, uses the frozen statistics.

        :return: ``({agent_id: action}, None)``; an action is batched where its observation is.
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
        for agent, obs in observation.items():
            policy_obs = self._policy_input(agent, obs)
            actions[agent], _ = self.policies[agent].predict(policy_obs, deterministic=deterministic)  # type: ignore[arg-type]
        return actions, None

    def export_agent(self, agent_id: AgentID, path: str | pathlib.Path | io.BufferedIOBase) -> None:
        """Write one agent's policy as a plain SB3 ``PPO`` zip: ``stable_baselines3.PPO.load(path)`` opens it (without
        importing sb3_ippo), and its deterministic actions on raw observations equal this model's for that agent.

        With ``normalize_obs``, the frozen observation statistics are folded into the first layer of the actor and
        of the critic (``sb3_ippo.export``): exact up to float rounding for observations within 10 standard
        deviations of the running mean; IPPO clips farther ones to 10, the exported policy does not.

        :raises KeyError: for an unknown agent id.
        :raises ValueError: with ``normalize_obs``, for a policy whose first layers cannot take the statistics.
        """
        if agent_id not in self._policy_keys:
            raise KeyError(f"Unknown agent id {agent_id!r}: the model's agents are {self.possible_agents}")
        policy = self.policies[agent_id]
        ppo = PPO(
            type(policy),
            env=None,  # type: ignore[arg-type]
            learning_rate=self.learning_rate,
            n_steps=max(self.n_steps or 2048, 2),
            batch_size=self.batch_size or 64,
            n_epochs=self.n_epochs,
            gamma=self.gamma,
            gae_lambda=self.gae_lambda,
            clip_range=self.clip_range,
            clip_range_vf=self.clip_range_vf,
            ent_coef=self.ent_coef,
            vf_coef=self.vf_coef,
            max_grad_norm=self.max_grad_norm if self.max_grad_norm is not None else float("inf"),
            target_kl=self.target_kl,
            policy_kwargs=self.policy_kwargs,
            device=self.device,
            _init_setup_model=False,
        )
        ppo.observation_space = policy.observation_space
        ppo.action_space = self.action_spaces[agent_id]
        ppo.n_envs = 1
        ppo.num_timesteps = self.num_timesteps
        ppo._setup_model()
        ppo.policy.load_state_dict(policy.state_dict())
        ppo.policy.optimizer.load_state_dict(policy.optimizer.state_dict())
        if self.obs_normalizers is not None:
            fold_observation_normalization(ppo.policy, self.obs_normalizers[agent_id])
        ppo.save(path)
