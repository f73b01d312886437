"""IPPO: one SB3 ``ActorCriticPolicy`` per PettingZoo agent, trained by PPO on that agent's own trajectories."""

from __future__ import annotations

import copy
import functools
import inspect
import io
import numbers
import pathlib
import warnings
from collections.abc import Callable, Iterable, Mapping
from types import MappingProxyType
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch as th
from gymnasium import spaces
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
from stable_baselines3.common.base_class import BaseAlgorithm
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.policies import ActorCriticPolicy, BasePolicy
from stable_baselines3.common.type_aliases import MaybeCallback, Schedule
from stable_baselines3.common.utils import FloatSchedule
from stable_baselines3.common.utils import set_random_seed as set_global_random_seed
from torch import nn

from sb3_ippo import serialization
from sb3_ippo.buffer import AgentEpisodeBuffer, VersionStamp
from sb3_ippo.export import export_agent
from sb3_ippo.groups import AgentGroup, make_groups
from sb3_ippo.hyperparameters import RULES as HYPERPARAMETER_RULES
from sb3_ippo.hyperparameters import check_hyperparameters
from sb3_ippo.ippo.checks import check_agent_spaces, check_env_matches, no_update_message
from sb3_ippo.ippo.networks import group_policy_class, make_group_policies, module_keys
from sb3_ippo.ippo.logs import dump_logs, log_names, record_update
from sb3_ippo.ippo.policies import CnnPolicy, MlpPolicy, MultiInputPolicy
from sb3_ippo.normalization import ObservationNormalizer, ReturnNormalizer
from sb3_ippo.preprocessing import to_env_action
from sb3_ippo.self_play import FrozenSeats, SnapshotOpponent, make_frozen_seats
from sb3_ippo.types import AgentID, ObsArray
from sb3_ippo.update.learner import LearnerProcess
from sb3_ippo.update.ppo import UpdateStats
from sb3_ippo.update.runners import GroupRunner, policy_input
from sb3_ippo.update.settings import UPDATE_SETTINGS, KLStop, UpdateSettings
from sb3_ippo.update.trainer import Trainer, UpdateJob, UpdateResult
from sb3_ippo.vec_env import MultiAgentStep, MultiAgentVecEnv, as_multiagent_vec_env
from sb3_ippo.vec_env.turn_based import is_turn_based_vec_env

SelfIPPO = TypeVar("SelfIPPO", bound="IPPO")

def _select_rows(obs: ObsArray, rows: np.ndarray) -> ObsArray:
    if isinstance(obs, dict):
        return {key: value[rows] for key, value in obs.items()}
    return obs[rows]


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
    learner process while collection goes on with the previous policies (see the parameter).

    :param policy: The policy class of every agent: "MlpPolicy", "CnnPolicy", "MultiInputPolicy" or an
        ``ActorCriticPolicy`` subclass. An agent whose observation is a Dict with an ``action_mask`` gets sb3-contrib's
        maskable counterpart (or give a ``MaskableActorCriticPolicy`` subclass): see ``sb3_ippo.masking``.
    :param env: A PettingZoo ``ParallelEnv``, an ``AECEnv`` (run in parallel where PettingZoo can, else stepped turn
        by turn: the classic games, ``sb3_ippo.vec_env.turn_based``), or ``sb3_ippo.make_vec_env(...)``. None only when
        loading a model for prediction.
    :param learning_rate: The learning rate of every agent's Adam optimizer; a constant or a schedule of the
        remaining progress (from 1 to 0).
    :param n_steps: If set, an update is due once every agent that has acted has finished trajectories covering
        at least ``n_steps`` transitions (reference: ``min_steps_per_epoch``), and it drains just enough of the
        oldest ones; ``n_episodes`` is then ignored. None: count episodes.
    :param n_episodes: An update is due once every agent that has acted has ``n_episodes`` finished
        trajectories (reference: ``traj_per_epoch``), and it drains exactly that many, oldest first; the excess
        waits for the next update. With ``rollout_len``, each chunk counts as a trajectory. May be None when
        ``n_steps`` is set (it is then ignored).
    :param batch_size: Minibatch size, in transitions; None: the agent's whole batch is one minibatch.
    :param n_epochs: The maximum number of passes over an agent's batch (reference: ``train_pi_iters``).
    :param gamma: Discount factor.
    :param gae_lambda: GAE's bias/variance trade-off (reference: ``lam``).
    :param time_limit_bootstrap: A truncated episode (a time limit: the env's, or ``max_episode_steps``) bootstraps
        from V(s_T), the value of the observation it was cut off at, as SB3 does with ``TimeLimit.truncated``. False:
        it bootstraps 0, as if terminated, as SuperSuit + SB3 and MAPPO's defaults do: the agent learns the return of
        the episode as the limit cuts it, the exact target where the observation shows the time left (on MPE, whose
        observations do not, the default learned better: ``docs/algorithm.md``). A chunk cut by ``rollout_len``
        always bootstraps.
    :param clip_range: PPO's clipping parameter; a constant or a schedule (reference: ``clip_ratio``).
    :param clip_range_vf: Clipping of the value-function change around the recomputed old values, on the
        value head's scale (normalized when ``normalize_returns``). None: no clipping.
    :param normalize_advantage: Normalize the advantages over each agent's batch.
    :param ent_coef: Entropy coefficient of the loss.
    :param vf_coef: Value-function coefficient of the loss.
    :param max_grad_norm: Gradient clipping norm (None: no clipping).
    :param target_kl: If a minibatch's approximate KL exceeds ``1.5 * target_kl``, that agent stops all its
        remaining passes (after or before that minibatch's gradient step: ``kl_stop``). None: no early stop.
    :param kl_stop: When the KL early stop is checked: ``"after_step"`` (the reference: the minibatch's gradient step
        is taken, then the passes stop) or ``"before_step"`` (SB3's PPO: the step is skipped). ``train/n_epochs_run``
        counts the passes that made at least one step either way.
    :param max_version_lag: A trajectory whose version is more than this many updates behind the current
        ``policy_version`` is stale: dropped at drain and counted. 0 keeps only data from the current policy.
    :param version_stamp: Which version a trajectory carries: ``"episode_end"`` (the reference: the version current
        when the trajectory ends, so an episode that spans an update counts as collected by the newer policy) or
        ``"first_step"`` (the version of its first step: stricter, it drops more spanning episodes).
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
    :param groups: ``{group name: [agent ids]}``: agents trained together (see ``batched``, ``share_parameters``,
        ``group_kwargs``). Agents it leaves out, or all agents when None, are grouped automatically: agents with the same
        id prefix (``agent_0``, ``agent_1`` -> ``agent``) and the same spaces. ``model.groups`` lists the result.
    :param share_parameters: True (every group) or ``{group name: True}``: the group's agents use ONE policy (one
        set of weights, one optimizer, one observation and return normalizer) trained on all their trajectories, as
        SuperSuit + SB3 do for a whole env. ``model.policies[a] is model.policies[b]`` within such a group.
    :param group_kwargs: ``{group name: {setting: value}}``: a group's own value of any update setting (the fields of
        ``sb3_ippo.update.settings.UpdateSettings``: the learning rate, passes and minibatches, clipping, loss
        coefficients, KL stop, discount and GAE, recomputation, shuffling), its ``policy`` or ``policy_kwargs`` (e.g.
        ``MultiInputPolicy`` for one group and ``MlpPolicy`` for another).
    :param batched: Evaluate and train the members of a group (same spaces, own weights) as one batch: acting is
        one forward call per group, and each minibatch one forward, backward, gradient clip and Adam step for the
        whole group, with every member's own Adam state and KL early stop. It takes the same random draws and does the
        same arithmetic as ``batched=False``, the one-agent-at-a-time reference path, so its results are equal up to
        float rounding (which long runs amplify: ``docs/algorithm.md``), at a fraction of the cost. Architectures that
        cannot be stacked (batch normalization, dropout, gSDE, another optimizer) fall back to the reference path
        with a warning.
    :param async_training: Overlap each update with collection (the reference's background training thread).
        ``learn`` starts one learner process (spawn) holding copies of the policies; when an update is due, the
        drained trajectories are sent to it and trained there, while collection fills the next batch with the
        current policies; the trained weights are applied, and ``policy_version`` advances, when the next update is
        due. Every batch after the first was thus collected by the previous version (lag 1, so ``max_version_lag``
        must be at least 1). Runs stay reproducible with a seed. A learner that fails or dies makes ``learn`` raise
        a ``RuntimeError``; the model keeps its last applied weights. Scripts need ``if __name__ == "__main__":``
        and picklable policies (``docs/algorithm.md``).
    :param opponents: ``{agent id: opponent}``: seats that a fixed opponent plays and that never train (nothing of
        theirs is stored): ``"random"`` (uniform among the legal moves), any model's ``predict`` (an IPPO model plays
        the seat with its policy for that agent; ``PPO``, ``MaskablePPO``, a policy), or a function of the batched
        observations that returns one action per row. Their moves are part of the other agents' environment. Not
        saved with the model (an opponent may be any object): pass it again to ``IPPO.load`` to continue training.
    :param self_play_pool: ``dict(snapshot_every=K, size=M)``: keep frozen copies of the learner's policies, one every
        K updates (and one at the start), the last M of them. In every episode of every env copy, one seat (drawn
        uniformly among the seats that ``opponents`` leaves free) is played by a snapshot drawn uniformly from the
        pool, and never trains there; the other seats learn. With ``share_parameters=True`` in a symmetric game the
        learner thus plays earlier versions of itself from every seat, the usual guard against cycling. None: no pool.
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
        n_episodes: int | None = 8,
        batch_size: int | None = None,
        n_epochs: int = 80,
        gamma: float = 0.99,
        gae_lambda: float = 0.97,
        time_limit_bootstrap: bool = True,
        clip_range: float | Schedule = 0.2,
        clip_range_vf: float | Schedule | None = None,
        normalize_advantage: bool = True,
        ent_coef: float = 0.0,
        vf_coef: float = 0.5,
        max_grad_norm: float | None = 0.5,
        target_kl: float | None = 0.02,
        kl_stop: KLStop = "after_step",
        max_version_lag: int = 1,
        version_stamp: VersionStamp = "episode_end",
        recompute_values: bool = True,
        recompute_log_prob: bool = True,
        shuffle_minibatches: bool = False,
        normalize_obs: bool = False,
        normalize_returns: bool = True,
        rollout_len: int | None = None,
        max_episode_steps: int | None = None,
        max_buffered_episodes: int | None = None,
        groups: Mapping[str, list[AgentID]] | None = None,
        share_parameters: bool | Mapping[str, bool] = False,
        group_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
        batched: bool = True,
        async_training: bool = False,
        opponents: Mapping[AgentID, Any] | None = None,
        self_play_pool: Mapping[str, int] | None = None,
        stats_window_size: int = 100,
        tensorboard_log: str | None = None,
        policy_kwargs: dict[str, Any] | None = None,
        verbose: int = 0,
        seed: int | None = None,
        device: th.device | str = "auto",
        _init_setup_model: bool = True,
    ) -> None:
        if isinstance(policy, type) and not issubclass(policy, (ActorCriticPolicy, MaskableActorCriticPolicy)):
            raise TypeError(
                f"policy must be an ActorCriticPolicy subclass or one of {list(self.policy_aliases)}, got {policy}"
            )
        if isinstance(policy, str) and policy not in self.policy_aliases:
            close = [name for name in self.policy_aliases if name.lower() == policy.lower()]
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise ValueError(
                f"Unknown policy {policy!r}{hint}: use one of {list(self.policy_aliases)} or an ActorCriticPolicy subclass"
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
        self.time_limit_bootstrap = time_limit_bootstrap
        self.clip_range = clip_range
        self.clip_range_vf = clip_range_vf
        self.normalize_advantage = normalize_advantage
        self.ent_coef = ent_coef
        self.vf_coef = vf_coef
        self.max_grad_norm = max_grad_norm
        self.target_kl = target_kl
        self.kl_stop = kl_stop
        self.max_version_lag = max_version_lag
        self.version_stamp = version_stamp
        self.recompute_values = recompute_values
        self.recompute_log_prob = recompute_log_prob
        self.shuffle_minibatches = shuffle_minibatches
        self.normalize_obs = normalize_obs
        self.normalize_returns = normalize_returns
        self.rollout_len = rollout_len
        self.max_episode_steps = max_episode_steps
        self.max_buffered_episodes = max_buffered_episodes
        self.group_definition = groups
        self.share_parameters = share_parameters
        self.group_kwargs = group_kwargs
        self.batched = batched
        self.async_training = async_training
        self.opponents = opponents
        self.self_play_pool = self_play_pool

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
        self._update_in_flight: UpdateJob | None = None
        self._learner: LearnerProcess | None = None

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
        """:raises ValueError: naming the first hyperparameter (or combination) that is not valid, and what it expects."""
        attributes = {"stats_window_size": "_stats_window_size", "groups": "group_definition"}
        check_hyperparameters({name: getattr(self, attributes.get(name, name)) for name in HYPERPARAMETER_RULES})

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
        if self.rollout_len is not None and is_turn_based_vec_env(env):
            raise ValueError(
                "rollout_len cannot cut the trajectories of a turn-based env: a move's reward arrives with the other "
                "players' replies, after the cut. Use rollout_len=None (games end by themselves)."
            )

    def set_env(self, env: Any, force_reset: bool = True) -> None:
        """Use a new env (same agents and spaces). Finished trajectories waiting for an update are kept.

        :raises ValueError: naming the first agent whose id or spaces differ.
        """
        vec_env = as_multiagent_vec_env(env)
        check_env_matches(self.possible_agents, self.observation_spaces, self.action_spaces, vec_env)
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
        self._policy_keys = module_keys(self.possible_agents)
        self._log_names = log_names(self.possible_agents)
        self._agent_groups = make_groups(
            self.possible_agents,
            self.observation_spaces,
            self.action_spaces,
            self.group_definition,
            self.share_parameters,
            self.group_kwargs,
        )
        self._group_log_names = log_names(list(self._agent_groups))
        self._group_of = {agent: group.name for group in self._agent_groups.values() for agent in group.agents}
        # Each group's update settings: the model's, where the group does not set its own (group_kwargs).
        self._update_settings = {
            name: UpdateSettings.from_values(vars(self), group.settings) for name, group in self._agent_groups.items()
        }
        policies = {
            agent: policy
            for group in self._agent_groups.values()
            for agent, policy in make_group_policies(
                group,
                group_policy_class(group, self.policy_class, self.policy_aliases),  # type: ignore[arg-type]
                self.observation_spaces,
                self.action_spaces,
                self._group_lr_schedule(group),
                group.settings.get("policy_kwargs", self.policy_kwargs),
                self.device,
            ).items()
        }
        self._policies = nn.ModuleDict({self._policy_keys[agent]: policy for agent, policy in policies.items()})
        if self.normalize_obs:
            self.obs_normalizers = self._per_agent(
                lambda agent: ObservationNormalizer(self.observation_spaces[agent]), self.obs_normalizers
            )
        if self.normalize_returns:
            self.return_normalizers = self._per_agent(lambda agent: ReturnNormalizer(), self.return_normalizers)
        self._runners = {
            name: GroupRunner(group, self.policies, self.observation_spaces, self.action_spaces, self.batched)
            for name, group in self._agent_groups.items()
        }
        self._trainer = Trainer(list(self._runners.values()), self.return_normalizers)
        self._make_buffers()
        self._seats: FrozenSeats | None = make_frozen_seats(
            self.possible_agents, self.action_spaces, self.opponents, self.self_play_pool, self._snapshot, self.seed
        )

    def _snapshot(self) -> SnapshotOpponent:
        """A frozen copy of every agent's policy, with the observation statistics of now (for the self-play pool)."""
        policies, obs_normalizers = copy.deepcopy((dict(self.policies), self.obs_normalizers))
        preprocess = {
            agent: functools.partial(
                policy_input,
                observation_space=self.observation_spaces[agent],
                obs_normalizer=None if obs_normalizers is None else obs_normalizers[agent],
            )
            for agent in self.possible_agents
        }
        return SnapshotOpponent(policies, preprocess)

    def _group_lr_schedule(self, group: AgentGroup) -> Schedule:
        learning_rate = group.settings.get("learning_rate")
        return self.lr_schedule if learning_rate is None else FloatSchedule(learning_rate)

    def _per_agent(self, make: Callable[[AgentID], Any], loaded: Mapping[AgentID, Any] | None = None) -> dict[AgentID, Any]:
        """One object per agent: ``loaded``'s (from a model file), else one from ``make``. Agents sharing parameters
        share one, their first agent's (they see one network's scale): a safe model file, which stores each agent's
        separately, loads them as equal copies, tied again here."""
        objects: dict[AgentID, Any] = {}
        for group in self._agent_groups.values():
            for agent in group.agents:
                if group.share_parameters and agent != group.agents[0]:
                    objects[agent] = objects[group.agents[0]]
                else:
                    objects[agent] = make(agent) if loaded is None else loaded[agent]
        return objects

    @property
    def groups(self) -> Mapping[str, list[AgentID]]:
        """Read-only mapping: group name -> its agent ids (see the ``groups`` parameter)."""
        return MappingProxyType({name: list(group.agents) for name, group in self._agent_groups.items()})

    def _make_buffers(self) -> None:
        """(Re)build the per-agent buffers for ``n_envs`` copies, keeping any finished trajectories."""
        old = getattr(self, "buffers", {})
        self.buffers = {
            agent: AgentEpisodeBuffer(self.n_envs, self.rollout_len, self.max_buffered_episodes, self.version_stamp)
            for agent in self.possible_agents
        }
        for agent, buffer in old.items():
            self.buffers[agent].finished = buffer.finished

    @property
    def policies(self) -> Mapping[AgentID, ActorCriticPolicy]:
        """Read-only mapping: agent id -> that agent's ``ActorCriticPolicy``."""
        return MappingProxyType({agent: self._policies[self._policy_keys[agent]] for agent in self.possible_agents})  # type: ignore[misc]

    @property
    def policy(self) -> BasePolicy:  # type: ignore[override]
        """There is no single ``policy``: SB3 code that reads it gets an ``AttributeError`` that says where to look."""
        raise AttributeError(
            "IPPO has one policy per agent, not one model.policy: use model.policies[agent_id] "
            f"(agents: {getattr(self, 'possible_agents', [])})"
        )

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
        if not isinstance(total_timesteps, numbers.Real) or isinstance(total_timesteps, bool) or not total_timesteps >= 1:
            raise ValueError(f"total_timesteps must be a positive number of env steps, got {total_timesteps!r}")
        self._check_hyperparameters()
        updates_at_start = self._n_updates
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
        finished_last, interrupted = False, True
        try:
            if self.async_training:
                self._learner = LearnerProcess(self._trainer)
            while self.num_timesteps < total_timesteps:
                if not self.collect_rollouts(self.env, callback, total_timesteps):
                    break
                if not self._update_due():
                    break  # The budget ran out before an update was due.
                if self._finish_update_in_flight() and not self._update_due():
                    continue  # The new version made waiting trajectories stale: collect more.
                self._update_current_progress_remaining(self.num_timesteps, total_timesteps)
                if self._learner is None:
                    self.train()
                else:
                    job = self._prepare_update()
                    self._learner.submit(job)
                    self._update_in_flight = job
                iteration += 1
                if log_interval is not None and iteration % log_interval == 0:
                    self.dump_logs(iteration)
            finished_last = self._finish_update_in_flight()
            interrupted = False
        except BaseException:
            # An update still in flight is discarded: the model keeps the last applied version.
            self._update_in_flight = None
            self._after_interruption()
            raise
        finally:
            self._stop_learner(wait=not interrupted)
        if finished_last and log_interval is not None:
            self.dump_logs(iteration)
        if self._n_updates == updates_at_start and self.num_timesteps >= total_timesteps:
            self._warn_no_update()
        callback.on_training_end()
        return self

    def _after_interruption(self) -> None:
        """Leave the model consistent after an exception or Ctrl-C inside ``learn``: it may have struck in the middle of
        a vectorized step, so the trajectories in progress are dropped (counted in ``episodes_lost``) and the next
        ``learn`` resets the env copies. Finished trajectories stay for the next update."""
        for buffer in self.buffers.values():
            self.episodes_lost += buffer.drop_open()
        self._last_obs = None

    def _warn_no_update(self) -> None:
        """Say (SB3 logger and ``warnings``) that ``learn`` spent its budget without a single update, and what would
        give one: an SB3 habit such as ``n_steps=2048`` with ``learn(1000)`` would otherwise be a silent no-op."""
        counts = [self.buffers[agent].fresh_counts(self.policy_version, self.max_version_lag) for agent in self._agents_seen]
        steps = self.num_timesteps - self._num_timesteps_at_start
        message = no_update_message(steps, self.policy_version, self.n_steps, self.n_episodes, counts)
        self.logger.warn(message)
        warnings.warn(message, UserWarning, stacklevel=3)

    def _update_due(self) -> bool:
        """An update is due when every agent that has acted so far has enough fresh finished trajectories.

        :raises ValueError: when an agent's buffer is full of fresh trajectories that are not enough for an update
            (``max_buffered_episodes`` too small for ``n_steps``): no update could ever come.
        """
        trigger = (self.n_episodes, self.n_steps, self.policy_version, self.max_version_lag)
        if self._update_in_flight is None:
            for agent in self._agents_seen:
                buffer = self.buffers[agent]
                if buffer.is_blocked(*trigger):
                    _, transitions = buffer.fresh_counts(self.policy_version, self.max_version_lag)
                    raise ValueError(
                        f"Agent {agent!r}'s buffer holds max_buffered_episodes={self.max_buffered_episodes} trajectories "
                        f"({transitions} transitions), fewer than n_steps={self.n_steps}: no update could ever be due. "
                        "Raise max_buffered_episodes or lower n_steps."
                    )
        return bool(self._agents_seen) and all(self.buffers[agent].is_ready(*trigger) for agent in self._agents_seen)

    def _act(
        self, obs: Mapping[AgentID, ObsArray], alive: Mapping[AgentID, np.ndarray], acting: list[AgentID]
    ) -> dict[AgentID, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Sample actions for every row of each acting agent's observations: ``{agent: (actions, values, log-probs)}``,
        values on the return scale. Each group's runner decides how its members act (``sb3_ippo.update.runners``)."""
        if self.obs_normalizers is not None:
            for agent in acting:
                self.obs_normalizers[agent].update(_select_rows(obs[agent], alive[agent]))
        sampled = {}
        for runner in self._runners.values():
            for agent, (actions, values, log_probs) in runner.act(obs, acting, self.obs_normalizers).items():
                values_np = values.flatten().cpu().numpy()
                if self.return_normalizers is not None:
                    # Stored on the return scale, with the statistics the value head was trained to: GAE without
                    # recompute_values uses them as they were.
                    values_np = self.return_normalizers[agent].denormalize(values_np)
                sampled[agent] = (actions.cpu().numpy(), values_np, log_probs.cpu().numpy())
        return sampled

    def _env_actions(self, agent: AgentID, actions: np.ndarray) -> np.ndarray:
        action_space = self.action_spaces[agent]
        if isinstance(action_space, spaces.Box):
            policy = self.policies[agent]
            if policy.squash_output:
                return policy.unscale_action(actions)
            return np.clip(actions, action_space.low, action_space.high)
        return to_env_action(actions, action_space)

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
            # Where the learner acts: every alive agent, but not the seats that frozen opponents play (self_play.py).
            learning = alive if self._seats is None else self._seats.learning(alive)
            acting = [agent for agent in self.possible_agents if learning[agent].any()]
            sampled = self._act(obs, learning, acting)
            env_actions = {agent: self._env_actions(agent, sampled[agent][0]) for agent in acting}
            if self._seats is not None:
                self._seats.play(obs, alive, env_actions, self.action_spaces)
            step = env.step_agents(env_actions)
            self.num_timesteps += env.num_envs
            recorded = self._handle_env_restarts(step)

            for agent in acting:
                actions, values, log_probs = sampled[agent]
                self.buffers[agent].add(
                    learning[agent] & recorded,
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
            self._credit_waiting_agents(step, learning)
            self._count_dropped_episodes()

            # What SB3 callbacks read from `locals`.
            new_obs, dones, infos = step.obs, step.dones, step.infos
            agent_rewards = step.rewards
            rewards = np.sum([step.rewards[agent] for agent in acting], axis=0)
            self._update_info_buffer(infos, dones)
            self._last_obs = new_obs  # type: ignore[assignment]
            self._last_alive = step.alive
            self._last_episode_starts = dones
            if self._seats is not None:
                self._seats.start_episodes(dones)
            callback.update_locals(locals())
            continue_training = callback.on_step()

        callback.on_rollout_end()
        return continue_training

    def _credit_waiting_agents(self, step: MultiAgentStep, acted: Mapping[AgentID, np.ndarray]) -> None:
        """Rewards and episode ends that reach agents in copies where they did not act (in a turn-based env, during
        the other players' moves) belong to their last transition there (``AgentEpisodeBuffer.credit``)."""
        for agent in self.possible_agents:
            ends = step.terminations[agent] | step.truncations[agent]
            waiting = ~acted[agent] & ((step.rewards[agent] != 0) | ends)
            if waiting.any():
                self.buffers[agent].credit(
                    waiting,
                    step.rewards[agent],
                    step.terminations[agent],
                    step.truncations[agent],
                    step.final_obs[agent],
                    self.policy_version,
                    self.max_version_lag,
                )

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
        (Runs in the calling thread; ``learn`` with ``async_training`` runs the same update in a learner process.)"""
        job = self._prepare_update()
        self._apply_update(job, self._trainer.update(job))

    def _prepare_update(self) -> UpdateJob:
        """Drain the batches (dropping stale trajectories) and read each group's settings at the current progress."""
        trajectories = {}
        for agent in self.possible_agents:
            drained = self.buffers[agent].drain(self.n_episodes, self.n_steps, self.policy_version, self.max_version_lag)
            if drained:
                trajectories[agent] = drained
        self._count_dropped_episodes()
        generator_seeds = None
        if any(settings.shuffle_minibatches for settings in self._update_settings.values()):
            # One per agent, so the batched and the one-agent-at-a-time paths draw the same permutations; drawn here,
            # in the collecting process, so that the update leaves torch's global RNG alone wherever it runs.
            generator_seeds = {agent: int(th.randint(2**62, (1,)).item()) for agent in self.possible_agents}
        progress = self._current_progress_remaining
        return UpdateJob(
            trajectories=trajectories,
            obs_normalizers=self.obs_normalizers,
            progress_remaining=progress,
            settings={name: settings.at(progress) for name, settings in self._update_settings.items()},
            generator_seeds=generator_seeds,
        )

    def _apply_update(self, job: UpdateJob, stats: dict[AgentID, UpdateStats], trained: UpdateResult | None = None) -> None:
        """Install the learner's results (weights, optimizer states and return statistics, in place), if the update ran
        there, advance ``policy_version`` and record the update's statistics."""
        if trained is not None:
            trained.install(self.policies, self.return_normalizers)
        self.update_stats = stats
        self.policy_version += 1
        self._n_updates += 1
        if self._seats is not None:
            self._seats.after_update(self.policy_version)
        self._record_update(job)

    def _finish_update_in_flight(self) -> bool:
        """Wait for the learner's update, if one runs, and apply it. Returns whether there was one.

        :raises RuntimeError: if the learner failed or died; the model keeps its last applied version.
        """
        if self._update_in_flight is None:
            return False
        job = self._update_in_flight
        self._update_in_flight = None
        assert self._learner is not None
        trained = self._learner.result()
        self._apply_update(job, trained.stats, trained)
        return True

    def _stop_learner(self, wait: bool) -> None:
        """Stop the learner process, if one runs: gracefully after a normal end (``wait``), at once otherwise."""
        if self._learner is not None:
            learner, self._learner = self._learner, None
            learner.close(timeout=5.0 if wait else 0.0)

    def _record_update(self, job: UpdateJob) -> None:
        record_update(self, job)

    def dump_logs(self, iteration: int = 0) -> None:
        """Write the rollout and time statistics, with the last update's, to the logger (SB3's on-policy layout)."""
        dump_logs(self, iteration)

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
            try:
                normalizer = None if self.obs_normalizers is None else self.obs_normalizers[agent]
                policy_obs = policy_input(obs, self.observation_spaces[agent], normalizer)
                action, _ = self.policies[agent].predict(policy_obs, deterministic=deterministic)  # type: ignore[arg-type]
                actions[agent] = to_env_action(action, self.action_spaces[agent])
            except (ValueError, TypeError) as error:
                space = self.observation_spaces[agent]
                expected = f"{space.shape} or (n, *{space.shape})" if space.shape else f"an element of {space}"
                raise ValueError(
                    f"Agent {agent!r}: its observation (shape {np.shape(obs) if not isinstance(obs, Mapping) else 'dict'}) "
                    f"does not fit its observation space {space}; expected shape {expected}. ({error})"
                ) from error
        return actions, None

    def export_agent(self, agent_id: AgentID, path: str | pathlib.Path | io.BufferedIOBase) -> None:
        """Write one agent's policy as a plain SB3 ``PPO`` zip: ``stable_baselines3.PPO.load(path)`` opens it (without
        importing sb3_ippo), and its deterministic actions on raw observations equal this model's for that agent.
        A masked agent (an ``action_mask`` in its observation) is written as a ``sb3_contrib.MaskablePPO`` zip: its
        observation is the env's without the mask, and its ``predict`` takes the mask as ``action_masks``.

        With ``normalize_obs``, the frozen observation statistics are folded into the first layer of the actor and
        of the critic (``sb3_ippo.export``): exact up to float rounding for observations within 10 standard
        deviations of the running mean; IPPO clips farther ones to 10, the exported policy does not.

        :raises KeyError: for an unknown agent id.
        :raises ValueError: with ``normalize_obs``, for a policy whose first layers cannot take the statistics.
        """
        export_agent(self, agent_id, path)


def default_update_settings(**overrides: Any) -> UpdateSettings:
    """IPPO's default update settings (the defaults of its signature, where they are written), with ``overrides``: for
    calling the update functions of ``sb3_ippo.update`` directly, as tests and benchmarks do."""
    parameters = inspect.signature(IPPO.__init__).parameters
    return UpdateSettings.from_values({name: parameters[name].default for name in UPDATE_SETTINGS}, overrides)
