"""IPPO: one SB3 ``ActorCriticPolicy`` per PettingZoo agent, trained by PPO on that agent's own trajectories."""

from __future__ import annotations

import copy
import functools
import inspect
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Literal

import torch as th
from sb3_contrib.common.maskable.policies import MaskableActorCriticPolicy
from stable_baselines3.common.policies import ActorCriticPolicy, BasePolicy
from stable_baselines3.common.type_aliases import Schedule
from stable_baselines3.common.utils import FloatSchedule
from torch import nn

from sb3_ippo.common.buffer import VersionStamp
from sb3_ippo.common.groups import AgentGroup, make_groups
from sb3_ippo.hyperparams.validation import RULES as HYPERPARAMETER_RULES
from sb3_ippo.hyperparams.validation import check_hyperparameters
from sb3_ippo.ippo.networks import group_policy_class, make_group_policies, module_keys
from sb3_ippo.ippo.policies import CnnPolicy, MlpPolicy, MultiInputPolicy
from sb3_ippo.common.logs import log_names
from sb3_ippo.common.normalization import ObservationNormalizer, ReturnNormalizer
from sb3_ippo.common.on_policy_algorithm import MultiAgentOnPolicyAlgorithm
from sb3_ippo.update.recurrent import RECURRENT_POLICY_ALIASES
from sb3_ippo.games.self_play import SnapshotOpponent, make_frozen_seats
from sb3_ippo.common.type_aliases import AgentID
from sb3_ippo.update.recurrent import make_group_runner
from sb3_ippo.update.runners import policy_input
from sb3_ippo.update.settings import UPDATE_SETTINGS, KLStop, UpdateSettings
from sb3_ippo.update.trainer import Trainer, UpdateJob
from sb3_ippo.vec_env import as_multiagent_vec_env


class IPPO(MultiAgentOnPolicyAlgorithm):
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
    gradient clipping), and by default it collects and updates as SB3's PPO does (a rollout of ``rollout_len`` steps of
    every env copy, 10 shuffled passes over minibatches of 256); it differs in what a batch may be (whole trajectories,
    the reference's rule, with ``n_episodes``), in when
    values and log-probs are computed (at update time, by default) and in the early stop (checked before every
    gradient step, stopping all remaining passes of that agent). With ``async_training``, each update runs in a
    learner process while collection goes on with the previous policies (see the parameter).

    :param policy: The policy class of every agent: "MlpPolicy", "CnnPolicy", "MultiInputPolicy" or an
        ``ActorCriticPolicy`` subclass. An agent whose observation is a Dict with an ``action_mask`` gets sb3-contrib's
        maskable counterpart (or give a ``MaskableActorCriticPolicy`` subclass): see ``sb3_ippo.games.masking``.
        Recurrent policies: sb3-contrib's "MlpLstmPolicy", "CnnLstmPolicy", "MultiInputLstmPolicy" or any
        ``RecurrentActorCriticPolicy`` subclass give each agent an LSTM whose state is carried through its episode and
        that is trained on whole trajectories (``sb3_ippo.update.recurrent``, ``docs/usage.md``).
    :param env: A PettingZoo ``ParallelEnv``, an ``AECEnv`` (run in parallel where PettingZoo can, else stepped turn
        by turn: the classic games, ``sb3_ippo.games.turn_based``), or ``sb3_ippo.make_vec_env(...)``. None only when
        loading a model for prediction.
    :param learning_rate: The learning rate of every agent's Adam optimizer; a constant or a schedule of the
        remaining progress (from 1 to 0).
    :param n_steps: If set, an update is due once every agent that has acted has finished trajectories covering
        at least ``n_steps`` transitions (reference: ``min_steps_per_epoch``), and it drains just enough of the
        oldest ones; ``n_episodes`` is then ignored. None (the default): ``n_episodes`` trajectories if it is set, else
        one rollout of every env copy (``rollout_len * n_envs`` transitions per agent). NOTE: SB3's ``n_steps`` counts
        steps per env copy; this one counts one agent's transitions over all copies: SB3's ``n_steps=N`` is
        ``rollout_len=N`` here.
    :param n_episodes: If set (and ``n_steps`` is not), an update is due once every agent that has acted has
        ``n_episodes`` finished trajectories (the reference's rule: ``traj_per_epoch``, 8), and it drains exactly that
        many, oldest first; the excess waits for the next update. ``rollout_len`` still cuts longer trajectories into
        pieces, each one counting: ``rollout_len=None`` gives the reference's whole episodes, a batch that grows with
        episode length. None (the default): ``rollout_len``'s rule.
    :param batch_size: Minibatch size, in transitions (SB3's PPO: 64; PettingZoo's SB3 tutorials: 256); None: the
        agent's whole batch is one minibatch (the reference's; its number of gradient steps per sample then falls
        as episodes get longer).
    :param n_epochs: The maximum number of passes over an agent's batch (SB3's PPO: 10; the reference's
        ``train_pi_iters``: 80). The defaults were chosen by return at equal wall-clock time across the benchmark
        suite (``docs/hyperparameters.md``).
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
    :param use_sde: Explore with generalized State-Dependent Exploration (gSDE) instead of independent Gaussian noise,
        as SB3's PPO does (Box actions only; an agent with other actions is refused, naming it: enable gSDE for one
        group with ``group_kwargs={group: dict(policy_kwargs=dict(use_sde=True))}``). Each agent's policy draws its
        exploration matrix, one per env copy (and per member, for a group sharing parameters), from its current
        standard deviation at the start of every rollout (the collection between two updates), and every
        ``sde_sample_freq`` steps if set. ``policy_kwargs=dict(use_sde=True)`` sets it too.
    :param sde_sample_freq: With ``use_sde``: draw new exploration matrices every this many vectorized env steps
        within a rollout; -1 (or 0): only at the start of each rollout.
    :param target_kl: If a minibatch's approximate KL exceeds ``1.5 * target_kl``, that agent stops all its
        remaining passes (after or before that minibatch's gradient step: ``kl_stop``). None (the default, as SB3's
        PPO): no early stop; the reference used 0.01 with 80 passes.
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
    :param shuffle_minibatches: Shuffle transitions before each pass (the default, as SB3's PPO). False (the
        reference's) keeps stored order, so minibatches hold contiguous pieces of trajectories.
    :param normalize_obs: Keep per-agent running mean/std of observations (vector ``Box`` entries), updated
        during training, frozen in ``predict`` and evaluation, saved with the model.
    :param normalize_returns: Keep per-agent running statistics of the returns; the value head then predicts
        normalized returns, which are de-normalized before GAE.
    :param rollout_len: SB3's rollout length per env copy (SB3's ``n_steps``): every agent's trajectory in a copy is
        cut each time the agent's steps there reach a multiple of ``rollout_len``, counted across episode ends (an
        episode end in between closes a shorter piece; a cut chunk bootstraps from V(the next observation)), and,
        with neither ``n_steps`` nor ``n_episodes`` set, an update takes ``rollout_len * n_envs`` transitions per
        agent. Where every agent acts in every step, that is an update every ``rollout_len`` steps of the copies, each
        batch collected by one policy version, whatever the episode length: with the defaults (``rollout_len=128``,
        ``batch_size=256``, ``n_epochs=10``, ``target_kl=None``, ``shuffle_minibatches=True``) every agent collects and
        updates as SB3's ``PPO(..., n_steps=128, batch_size=256)`` does, with IPPO's value targets (``gae_lambda``,
        ``normalize_returns``, ``time_limit_bootstrap``). An agent that sits out steps of a copy (it left its episode
        early, or joins late) counts only its own steps, and an update waits for every agent that has acted. A
        turn-based game is never cut (a move's reward arrives with the other players' replies): its updates take
        whole games covering ``rollout_len * n_envs`` transitions per agent. None: trajectories are whole episodes
        (then set ``n_steps`` or ``n_episodes``).
    :param align_rollouts: Under ``rollout_len``'s rule, end a rollout early at a step where every env copy's episode
        ended, when another episode as long as those would not fit in the rollout: the next rollout then starts with
        whole episodes, none cut. Where episodes have one length and the copies run in step (MPE's ``max_cycles``,
        pursuit), every update thus takes whole episodes (on MPE's 25-step episodes and ``rollout_len=128``: rollouts
        of 125 steps), which learned far better than cutting them (``docs/hyperparameters.md``); where episodes end at
        different steps in different copies, rollouts are SB3's. False: SB3's cadence to the step, episodes cut.
    :param max_episode_steps: Truncate every episode after this many env steps (None: the env decides).
    :param max_buffered_episodes: Per agent, at most this many finished trajectories wait for an update; when
        full (after dropping stale ones), new trajectories are rejected and counted in ``rejected_episodes``.
        Under ``n_episodes``' rule, it must be at least ``n_episodes``, or no update could ever be due.
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
        cannot be stacked (batch normalization, dropout, gSDE, another optimizer) fall back to the reference path with
        a warning; recurrent and masked policies, never stacked, take it without one.
    :param async_training: Overlap each update with collection (the reference's background training thread).
        ``learn`` starts one learner process (spawn) holding copies of the policies; when an update is due, the
        drained trajectories are sent to it and trained there, while collection fills the next batch with the
        current policies; the trained weights are applied, and ``policy_version`` advances, when the next update is
        due. Every batch after the first was thus collected by the previous version (lag 1, so ``max_version_lag``
        must be at least 1). Runs stay reproducible with a seed. A learner that fails or dies makes ``learn`` raise
        a ``RuntimeError``; the model keeps its last applied weights. The policies must be picklable; a class written
        in the training script itself needs the script's ``if __name__ == "__main__":`` (``docs/algorithm.md``).
        It pays only where the update is a large share of the time (many passes, large networks, cheap envs): with
        the default update it bought 2% on simple_spread, and the one version of lag cost return, so False (the
        default) updates in this process, each batch trained by the policy that collected it.
        ``"auto"``: a learner process for a ``learn`` of at least 20,000 env steps
        (``AUTO_MIN_TIMESTEPS``, below which starting one does not pay) when this process has a second CPU core and
        may start processes (not a ``multiprocessing.Pool`` worker) and ``max_version_lag >= 1``; otherwise the
        updates run in this process, as with False. Where the policies cannot be sent to a learner (not picklable,
        a class of a notebook or of a script without that guard), one warning says why and training goes on here.
        So its results depend on the budget and the machine: set True or False for runs that must match across
        machines.
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
    :param policy_kwargs: Keyword arguments for every agent's policy, e.g. ``dict(net_arch=[64, 64])``. Where they do
        not set ``log_std_init``, a Gaussian policy on Box actions starts with SB3's std of 1, narrowed to half the
        action range where that is less (mpe2's [0, 1]: 0.5), except with gSDE.
    :param verbose: 0 no output, 1 training information, 2 debug.
    :param seed: Seed for the pseudo-random generators and the env copies (copy ``i`` gets ``seed + i``).
    :param device: Device (cpu, cuda, ...) on which the code should be run; "auto" picks cuda if available.
    :param _init_setup_model: Whether or not to build the networks on creation of the instance.
    """

    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {
        "MlpPolicy": MlpPolicy,
        "CnnPolicy": CnnPolicy,
        "MultiInputPolicy": MultiInputPolicy,
        **RECURRENT_POLICY_ALIASES,
    }

    def __init__(
        self,
        policy: str | type[ActorCriticPolicy],
        env: Any,
        learning_rate: float | Schedule = 3e-4,
        n_steps: int | None = None,
        n_episodes: int | None = None,
        batch_size: int | None = 256,
        n_epochs: int = 10,
        gamma: float = 0.99,
        gae_lambda: float = 0.97,
        time_limit_bootstrap: bool = True,
        clip_range: float | Schedule = 0.2,
        clip_range_vf: float | Schedule | None = None,
        normalize_advantage: bool = True,
        ent_coef: float = 0.0,
        vf_coef: float = 0.5,
        max_grad_norm: float | None = 0.5,
        use_sde: bool = False,
        sde_sample_freq: int = -1,
        target_kl: float | None = None,
        kl_stop: KLStop = "after_step",
        max_version_lag: int = 1,
        version_stamp: VersionStamp = "episode_end",
        recompute_values: bool = True,
        recompute_log_prob: bool = True,
        shuffle_minibatches: bool = True,
        normalize_obs: bool = False,
        normalize_returns: bool = True,
        rollout_len: int | None = 128,
        align_rollouts: bool = True,
        max_episode_steps: int | None = None,
        max_buffered_episodes: int | None = None,
        groups: Mapping[str, list[AgentID]] | None = None,
        share_parameters: bool | Mapping[str, bool] = False,
        group_kwargs: Mapping[str, Mapping[str, Any]] | None = None,
        batched: bool = True,
        async_training: bool | Literal["auto"] = False,
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
        policy_kwargs, use_sde = _use_sde_from_policy_kwargs(policy_kwargs, use_sde)
        super().__init__(
            policy=policy,
            env=None,
            learning_rate=learning_rate,
            policy_kwargs=policy_kwargs,
            use_sde=use_sde,
            sde_sample_freq=sde_sample_freq,
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
        self.align_rollouts = align_rollouts
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
        self.obs_normalizers = None
        self.return_normalizers = None
        self._agents_seen = set()
        self._last_alive = None
        self.update_stats = {}
        self._update_in_flight = None
        self._learner = None
        self._rollout_ended = False

        if _init_setup_model:
            self._check_hyperparameters()
            if env is None:
                raise ValueError(
                    "IPPO needs an environment to build one policy per agent: pass a PettingZoo ParallelEnv, an "
                    "AECEnv or sb3_ippo.make_vec_env(...). To use a saved model without one, call IPPO.load(path)."
                )
            self._use_env(as_multiagent_vec_env(env))
            if self._rollout_rule():
                self._check_hyperparameters()  # again with n_envs: rollout_len's batch is rollout_len * n_envs
            self._setup_model()

    def _check_hyperparameters(self) -> None:
        """:raises ValueError: naming the first hyperparameter (or combination) that is not valid, and what it expects."""
        attributes = {"stats_window_size": "_stats_window_size", "groups": "group_definition"}
        values = {name: getattr(self, attributes.get(name, name)) for name in HYPERPARAMETER_RULES}
        if getattr(self, "n_envs", None) is not None:
            values["n_envs"] = self.n_envs  # the batch of rollout_len's rule: rollout_len * n_envs transitions
        check_hyperparameters(values)

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
                self._group_policy_kwargs(group),
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
            name: make_group_runner(group, self.policies, self.observation_spaces, self.action_spaces, self.batched)
            for name, group in self._agent_groups.items()
        }
        self._trainer = Trainer(list(self._runners.values()), self.return_normalizers)
        self._reset_noise()  # gSDE's first matrices, on the policies' device (as SB3's load does)
        self._make_buffers()
        self._seats = make_frozen_seats(
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

    def _group_policy_kwargs(self, group: AgentGroup) -> dict[str, Any]:
        """The keyword arguments of the group's policies: its own ``policy_kwargs`` or the model's, with ``use_sde``
        where those do not say otherwise (as SB3 passes its ``use_sde`` to the policy)."""
        policy_kwargs = dict(group.settings.get("policy_kwargs", self.policy_kwargs) or {})
        if self.use_sde:
            policy_kwargs.setdefault("use_sde", True)
        return policy_kwargs

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

    def train(self) -> None:
        """Drain each agent's oldest trajectories and update its policy on them; then ``policy_version`` advances.
        (Runs in the calling thread; ``learn`` with ``async_training`` runs the same update in a learner process.)"""
        job = self._prepare_update()
        self._apply_update(job, self._trainer.update(job))

    def _prepare_update(self) -> UpdateJob:
        """Drain the batches (dropping stale trajectories) and read each group's settings at the current progress."""
        trajectories = self._drain()
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


def _use_sde_from_policy_kwargs(
    policy_kwargs: dict[str, Any] | None, use_sde: bool
) -> tuple[dict[str, Any] | None, bool]:
    """``policy_kwargs`` without ``use_sde``, and ``use_sde`` as the model's hyperparameter: SB3 passes its algorithm's
    ``use_sde`` to the policy, so ``policy_kwargs=dict(use_sde=True)`` (this package's way before the hyperparameter)
    becomes ``use_sde=True``.

    :raises ValueError: if the two disagree (``use_sde=True`` with ``policy_kwargs=dict(use_sde=False)``).
    """
    if not isinstance(policy_kwargs, Mapping) or "use_sde" not in policy_kwargs:
        return policy_kwargs, use_sde
    policy_kwargs = dict(policy_kwargs)
    from_kwargs = policy_kwargs.pop("use_sde")
    if use_sde is True and from_kwargs is False:
        raise ValueError(
            "use_sde=True and policy_kwargs=dict(use_sde=False) contradict each other: set gSDE once, with IPPO's "
            "use_sde argument (for one group only: group_kwargs={group: dict(policy_kwargs=dict(use_sde=True))})"
        )
    return policy_kwargs, from_kwargs if use_sde is False else use_sde


def default_update_settings(**overrides: Any) -> UpdateSettings:
    """IPPO's default update settings (the defaults of its signature, where they are written), with ``overrides``: for
    calling the update functions of ``sb3_ippo.update`` directly, as tests and benchmarks do."""
    parameters = inspect.signature(IPPO.__init__).parameters
    return UpdateSettings.from_values({name: parameters[name].default for name in UPDATE_SETTINGS}, overrides)
