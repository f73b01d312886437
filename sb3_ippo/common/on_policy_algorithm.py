"""The multi-agent on-policy loop that IPPO runs, as SB3's ``OnPolicyAlgorithm`` is PPO's: ``learn`` (collect -> update
-> apply, synchronously or with the learner process), collection into the per-agent buffers, and ``export_agent``.
The env, the policies, ``predict``, ``save`` and ``load`` are :mod:`sb3_ippo.common.base_class`'s.

:class:`MultiAgentOnPolicyAlgorithm` leaves to its subclass what makes the algorithm: its hyperparameters and their
documentation (``__init__``), building the policies, groups and trainer (``_setup_model``), and preparing and running
an update (``_prepare_update``, ``train``).
"""

from __future__ import annotations

import io
import numbers
import pathlib
import warnings
from collections.abc import Mapping
from typing import Any, TypeVar

import numpy as np
from gymnasium import spaces
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.type_aliases import MaybeCallback

from sb3_ippo.common.acting import select_rows
from sb3_ippo.common.base_class import MultiAgentBaseAlgorithm
from sb3_ippo.common.buffer import AgentEpisodeBuffer, Trajectory
from sb3_ippo.common.checks import check_env_matches, no_update_message
from sb3_ippo.common.export import export_agent
from sb3_ippo.common.logs import dump_logs, learned_summary, print_every, record_update, throttle_stdout
from sb3_ippo.common.preprocessing import to_env_action
from sb3_ippo.common.threads import learn_threads
from sb3_ippo.common.type_aliases import AgentID, ObsArray
from sb3_ippo.games.turn_based import is_turn_based_vec_env
from sb3_ippo.update.learner import AUTO_MIN_TIMESTEPS, LearnerProcess, why_no_learner
from sb3_ippo.update.ppo import UpdateStats
from sb3_ippo.update.recurrent import RecurrentGroupRunner
from sb3_ippo.update.trainer import Trainer, UpdateJob, UpdateResult
from sb3_ippo.vec_env import MultiAgentStep, MultiAgentVecEnv, as_multiagent_vec_env

SelfOnPolicy = TypeVar("SelfOnPolicy", bound="MultiAgentOnPolicyAlgorithm")


class MultiAgentOnPolicyAlgorithm(MultiAgentBaseAlgorithm):
    """The base of multi-agent on-policy algorithms on PettingZoo envs (see the module docstring): it runs the groups,
    policies, runners, trainer and buffers that its subclass's ``_setup_model`` builds."""

    _update_in_flight: UpdateJob | None
    # align_rollouts: the rollout in progress ended early, at an episode end of every copy; its update is due.
    _rollout_ended: bool
    _learner: LearnerProcess | None
    _trainer: Trainer

    def _prepare_update(self) -> UpdateJob:
        """Drain the batches of the next update, with its settings (``learn`` sends them to the learner process)."""
        raise NotImplementedError

    def train(self) -> None:
        """One update, in the calling thread, applied (``_apply_update``)."""
        raise NotImplementedError

    # ----------------------------------------------------------------------------------------------------------
    # Environment and buffers
    # ----------------------------------------------------------------------------------------------------------

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

    def _make_buffers(self) -> None:
        """(Re)build the per-agent buffers for ``n_envs`` copies, keeping any finished trajectories (and, for the same
        number of copies, each copy's place in its ``rollout_len`` rollout, without the trajectories left open)."""
        old = getattr(self, "buffers", {})
        self.buffers = {
            agent: AgentEpisodeBuffer(self.n_envs, self._cut_len, self.max_buffered_episodes, self.version_stamp)
            for agent in self.possible_agents
        }
        for agent, buffer in old.items():
            self.buffers[agent].finished = buffer.finished
            if buffer.n_envs == self.n_envs and buffer.rollout_len == self._cut_len:
                buffer.drop_open()
                self.buffers[agent].steps_since_cut = buffer.steps_since_cut

    def _update_trigger(self) -> tuple[int | None, int | None]:
        """``(n_episodes, n_steps)`` of the batch rule, as the buffers take them: ``n_steps`` transitions per agent if set;
        else ``n_episodes`` trajectories per agent if set (the reference's rule); else one rollout of every copy
        (``rollout_len * n_envs`` transitions per agent, the default), or, for a rollout that ended early
        (``align_rollouts``), ``(None, None)``: every fresh trajectory."""
        rollout_len = self.rollout_len
        if rollout_len is not None and self._rollout_rule():
            return (None, None) if self._rollout_ended else (None, rollout_len * self.n_envs)
        return self.n_episodes, self.n_steps

    def _end_rollout_at_shared_episode_end(self, step: MultiAgentStep) -> None:
        """``align_rollouts``: end the rollout now if every copy's episode ended in ``step`` and another episode as long
        as the longest of them would not fit in the rollout's ``rollout_len`` steps, so that the next rollout starts
        with whole episodes instead of cutting one in every copy. Copies whose episodes do not end together (episodes
        of varying length, a restarted copy) never end a rollout early: SB3's cadence applies."""
        if not (step.dones.all() and self.align_rollouts and self._rollout_rule() and self._cut_len is not None):
            return
        lengths = [info["episode"]["l"] for info in step.infos if "episode" in info]
        # Steps of each copy in this rollout (0 where rollout_len's cut fell on this very step: the rollout is whole).
        rollout_steps = max(max(buffer.steps_since_cut) for buffer in self.buffers.values())
        if len(lengths) < len(step.dones) or rollout_steps == 0 or rollout_steps + max(lengths) <= self._cut_len:
            return
        for buffer in self.buffers.values():
            buffer.end_rollout()
        self._rollout_ended = True

    def _drain(self) -> dict[AgentID, list[Trajectory]]:
        """Each agent's batch of the update that is due, drained from its buffer (dropping stale trajectories); agents
        with none are left out. The rollout that ended early, if one did, is then over."""
        trigger = (*self._update_trigger(), self.policy_version, self.max_version_lag)
        self._rollout_ended = False
        drained = {agent: self.buffers[agent].drain(*trigger) for agent in self.possible_agents}
        return {agent: trajectories for agent, trajectories in drained.items() if trajectories}

    @property
    def _cut_len(self) -> int | None:
        """The length at which trajectories are cut: ``rollout_len``, except in a turn-based game, which is never cut (a
        move's reward arrives with the other players' replies; games end by themselves): there, ``rollout_len``'s rule
        takes whole games covering ``rollout_len * n_envs`` transitions per agent."""
        return None if self.env is not None and is_turn_based_vec_env(self.env) else self.rollout_len

    def _rollout_rule(self) -> bool:
        """Whether updates follow ``rollout_len``'s rule (neither ``n_steps`` nor ``n_episodes`` set)."""
        return self.n_steps is None and self.n_episodes is None and self.rollout_len is not None

    # ----------------------------------------------------------------------------------------------------------
    # Training: collect -> drain -> recompute values -> GAE -> update -> apply
    # ----------------------------------------------------------------------------------------------------------

    def learn(
        self: SelfOnPolicy,
        total_timesteps: int,
        callback: MaybeCallback = None,
        log_interval: int = 1,
        tb_log_name: str = "IPPO",
        reset_num_timesteps: bool = True,
        progress_bar: bool = False,
    ) -> SelfOnPolicy:
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
        with learn_threads() as threads:
            return self._learn(
                total_timesteps, callback, log_interval, tb_log_name, reset_num_timesteps, progress_bar, threads
            )

    def _learn(
        self: SelfOnPolicy,
        total_timesteps: int,
        callback: MaybeCallback,
        log_interval: int,
        tb_log_name: str,
        reset_num_timesteps: bool,
        progress_bar: bool,
        threads: int,
    ) -> SelfOnPolicy:
        """``learn``'s loop, run with ``threads`` torch threads (``sb3_ippo.common.threads``)."""
        assert self.env is not None
        updates_at_start = self._n_updates
        previous_obs = self._last_obs
        total_timesteps, callback = self._setup_learn(
            total_timesteps, callback, reset_num_timesteps, tb_log_name, progress_bar
        )
        if self.verbose == 1 and not self._custom_logger:
            throttle_stdout(self.logger, print_every(total_timesteps - self.num_timesteps))
        if self._last_obs is not previous_obs:
            # The env copies were reset: the trajectories in progress cannot continue.
            for buffer in self.buffers.values():
                self.episodes_lost += buffer.drop_open()
            self._last_alive = self.env.alive
            self._reset_recurrent_states()
        iteration = 0
        callback.on_training_start(locals(), globals())
        finished_last, interrupted = False, True
        try:
            self._learner = self._start_learner(total_timesteps - self.num_timesteps, threads)
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
        if self.verbose >= 1:
            self.logger.info(learned_summary(self))
        callback.on_training_end()
        return self

    def _after_interruption(self) -> None:
        """Leave the model consistent after an exception or Ctrl-C inside ``learn``: it may have struck in the middle of
        a vectorized step, so the trajectories in progress are dropped (counted in ``episodes_lost``) and the next
        ``learn`` resets the env copies. Finished trajectories stay for the next update."""
        for buffer in self.buffers.values():
            self.episodes_lost += buffer.drop_open()
        self._last_obs = None
        self._reset_recurrent_states()

    def _start_learner(self, timesteps: int, threads: int) -> LearnerProcess | None:
        """The learner process of this ``learn`` (``async_training``), running ``threads`` torch threads, or None to
        update in this process.

        With ``"auto"``: a learner for ``timesteps`` of at least ``AUTO_MIN_TIMESTEPS`` where this process can run one
        beside it (two cores, not a daemonic process) and ``max_version_lag`` allows it; where the policies cannot
        be sent to one (not picklable, or a class of an interactive session), one warning says so and training goes
        on in this process.
        """
        if self.async_training is False:
            return None
        if self.async_training == "auto":
            if timesteps < AUTO_MIN_TIMESTEPS or self.max_version_lag < 1 or why_no_learner() is not None:
                return None
            try:
                return LearnerProcess(self._trainer, threads)
            except (TypeError, RuntimeError) as error:
                message = f'async_training="auto": the updates run in this process, not a learner process: {error}'
                self.logger.warn(message)
                warnings.warn(message, UserWarning, stacklevel=3)
                return None
        return LearnerProcess(self._trainer, threads)

    def _warn_no_update(self) -> None:
        """Say (SB3 logger and ``warnings``) that ``learn`` spent its budget without a single update, and what would
        give one: an SB3 habit such as ``n_steps=2048`` with ``learn(1000)`` would otherwise be a silent no-op."""
        counts = [self.buffers[agent].fresh_counts(self.policy_version, self.max_version_lag) for agent in self._agents_seen]
        steps = self.num_timesteps - self._num_timesteps_at_start
        n_episodes, n_steps = self._update_trigger()
        rollout_len = self.rollout_len if self._rollout_rule() else None
        message = no_update_message(steps, self.policy_version, n_steps, n_episodes, counts, rollout_len)
        self.logger.warn(message)
        warnings.warn(message, UserWarning, stacklevel=3)

    def _update_due(self) -> bool:
        """An update is due when every agent that has acted so far has enough fresh finished trajectories, or when the
        rollout ended early (``align_rollouts``) and any agent has some.

        :raises ValueError: when an agent's buffer is full of fresh trajectories that are not enough for an update
            (``max_buffered_episodes`` too small for ``n_steps``): no update could ever come.
        """
        if self._rollout_ended:
            return any(buffer.fresh_counts(self.policy_version, self.max_version_lag)[0] for buffer in self.buffers.values())
        n_episodes, n_steps = self._update_trigger()
        trigger = (n_episodes, n_steps, self.policy_version, self.max_version_lag)
        if self._update_in_flight is None:
            for agent in self._agents_seen:
                buffer = self.buffers[agent]
                if buffer.is_blocked(*trigger):
                    _, transitions = buffer.fresh_counts(self.policy_version, self.max_version_lag)
                    raise ValueError(
                        f"Agent {agent!r}'s buffer holds max_buffered_episodes={self.max_buffered_episodes} trajectories "
                        f"({transitions} transitions), fewer than n_steps={n_steps}: no update could ever be due. "
                        f"Raise max_buffered_episodes or lower {'n_steps' if self.n_steps is not None else 'rollout_len'}."
                    )
        return bool(self._agents_seen) and all(self.buffers[agent].is_ready(*trigger) for agent in self._agents_seen)

    def _act(
        self, obs: Mapping[AgentID, ObsArray], alive: Mapping[AgentID, np.ndarray], acting: list[AgentID]
    ) -> dict[AgentID, tuple[np.ndarray, np.ndarray, np.ndarray]]:
        """Sample actions for every row of each acting agent's observations: ``{agent: (actions, values, log-probs)}``,
        values on the return scale. Each group's runner decides how its members act (``sb3_ippo.update.runners``)."""
        if self.obs_normalizers is not None:
            for agent in acting:
                self.obs_normalizers[agent].update(select_rows(obs[agent], alive[agent]))
        sampled = {}
        for runner in self._runners.values():
            for agent, (actions, values, log_probs) in runner.act(obs, acting, self.obs_normalizers, alive).items():
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
        n_steps = 0
        self._reset_noise()
        callback.on_rollout_start()
        continue_training = True
        while continue_training and not self._update_due() and self.num_timesteps < total_timesteps:
            if self.sde_sample_freq > 0 and n_steps > 0 and n_steps % self.sde_sample_freq == 0:
                self._reset_noise()
            obs: dict[AgentID, ObsArray] = self._last_obs  # type: ignore[assignment]
            alive = self._last_alive
            # Where the learner acts: every alive agent, but not the seats that frozen opponents play (self_play.py).
            learning = alive if self._seats is None else self._seats.learning(alive)
            acting = [agent for agent in self.possible_agents if learning[agent].any()]
            initial_states = self._recurrent_states_before_step()
            sampled = self._act(obs, learning, acting)
            env_actions = {agent: self._env_actions(agent, sampled[agent][0]) for agent in acting}
            if self._seats is not None:
                self._seats.play(obs, alive, env_actions, self.action_spaces)
            step = env.step_agents(env_actions)
            self.num_timesteps += env.num_envs
            n_steps += 1
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
                    initial_states.get(agent),
                )
                self._agents_seen.add(agent)
            self._credit_waiting_agents(step, learning)
            self._end_rollout_at_shared_episode_end(step)
            self._end_recurrent_episodes(step)
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

    def _reset_noise(self) -> None:
        """Draw new gSDE exploration matrices for every agent whose policy uses gSDE (``use_sde``), from its current
        standard deviation, as SB3's ``collect_rollouts`` does: at the start of every rollout, and every
        ``sde_sample_freq`` steps. (No update resamples them: gSDE's log-probs do not depend on the draw.)"""
        for runner in self._runners.values():
            runner.reset_noise(self.n_envs)

    def _recurrent_runners(self) -> list[RecurrentGroupRunner]:
        return [runner for runner in self._runners.values() if isinstance(runner, RecurrentGroupRunner)]

    def _reset_recurrent_states(self) -> None:
        """Zero the hidden states of every recurrent agent, and of the frozen players, in every env copy (the copies
        were reset)."""
        for runner in self._recurrent_runners():
            runner.reset_states(self.n_envs)
        if self._seats is not None:
            self._seats.reset_states()

    def _recurrent_states_before_step(self) -> dict[AgentID, np.ndarray]:
        """The recurrent agents' hidden states before this step: the initial state of the trajectories it opens."""
        states: dict[AgentID, np.ndarray] = {}
        for runner in self._recurrent_runners():
            states.update(runner.states_before_step(self.n_envs))
        return states

    def _end_recurrent_episodes(self, step: MultiAgentStep) -> None:
        """Zero each recurrent agent's hidden state in the copies where its own episode ended (it terminated or was
        truncated, the copy's episode ended, or the copy was restarted): it starts its next trajectory from zeros."""
        runners = self._recurrent_runners()
        if not runners:
            return
        copy_ended = step.dones if step.restarted is None else step.dones | step.restarted
        for runner in runners:
            runner.end_episodes(
                {agent: step.terminations[agent] | step.truncations[agent] | copy_ended for agent in runner.agents}
            )

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
    # Export
    # ----------------------------------------------------------------------------------------------------------

    def export_agent(self, agent_id: AgentID, path: str | pathlib.Path | io.BufferedIOBase) -> None:
        """Write one agent's policy as a plain SB3 ``PPO`` zip: ``stable_baselines3.PPO.load(path)`` opens it (without
        importing sb3_ippo), and its deterministic actions on raw observations equal this model's for that agent.
        A masked agent (an ``action_mask`` in its observation) is written as a ``sb3_contrib.MaskablePPO`` zip: its
        observation is the env's without the mask, and its ``predict`` takes the mask as ``action_masks``.
        A recurrent agent is written as a ``sb3_contrib.RecurrentPPO`` zip: its ``predict(obs, state, episode_start)``
        gives the actions and states this model's ``predict`` gives for that agent.

        With ``normalize_obs``, the frozen observation statistics are folded into the first layer of the actor and
        of the critic (``sb3_ippo.common.export``): exact up to float rounding for observations within 10 standard
        deviations of the running mean; IPPO clips farther ones to 10, the exported policy does not.

        :raises KeyError: for an unknown agent id.
        :raises ValueError: with ``normalize_obs``, for a policy whose first layers cannot take the statistics.
        """
        export_agent(self, agent_id, path)
