"""The per-agent episode buffer: whole trajectories, stamped with the policy version that collected them.

One :class:`AgentEpisodeBuffer` per agent. During collection it keeps one open trajectory per env copy and
closes it when the agent's episode ends (terminated or truncated) or when ``rollout_len`` cuts it: every
``rollout_len`` of the agent's steps in that copy, counted across episode ends (SB3's rollout cadence), the count
starting again where a rollout ended early with the episodes (``end_rollout``). Finished
trajectories wait in arrival order until an update drains them; stale ones (collected by a policy more than
``max_version_lag`` versions old) are dropped and counted, never trained on.
"""

from __future__ import annotations

from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from sb3_ippo.common.type_aliases import ObsArray

VersionStamp = Literal["episode_end", "first_step"]
VERSION_STAMPS: tuple[VersionStamp, ...] = ("episode_end", "first_step")


@dataclass
class Trajectory:
    """One agent's trajectory, in time order.

    :param observations: ``(T, *obs_shape)`` (or a dict of such arrays), raw as the env gave them.
    :param actions: ``(T, *action_shape)``, as the policy sampled them (before clipping to the action space).
    :param rewards: ``(T,)``.
    :param values: ``(T,)`` V(s_t) at collection time, on the return scale (value-head outputs de-normalized with the
        return statistics of that time).
    :param log_probs: ``(T,)`` log pi(a|s) at collection time.
    :param terminated: True if the episode reached a terminal state: the trajectory bootstraps 0.
    :param bootstrap_obs: The observation after the last step, for a truncated or cut trajectory (bootstraps
        V(bootstrap_obs)); None when terminated.
    :param policy_version: The version the trajectory is stamped with (see ``AgentEpisodeBuffer``'s
        ``version_stamp``): that of its first step, or that current when it ended.
    :param truncated: True if the episode was truncated (a time limit: the env's, or ``max_episode_steps``); False
        if it is still going on and ``rollout_len`` cut this chunk of it, or if it terminated. Only a truncated
        trajectory may bootstrap 0 instead (IPPO's ``time_limit_bootstrap=False``); a cut one always bootstraps.
    :param initial_state: A recurrent policy's hidden state before the first step (``sb3_ippo.update.recurrent``): zeros at
        the agent's episode start, the state collection carried over for a chunk that ``rollout_len`` cut. None for
        feed-forward policies.
    """

    observations: ObsArray
    actions: np.ndarray
    rewards: np.ndarray
    values: np.ndarray
    log_probs: np.ndarray
    terminated: bool
    bootstrap_obs: Any
    policy_version: int
    truncated: bool = False
    initial_state: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.rewards)


@dataclass
class _OpenTrajectory:
    policy_version: int
    observations: list[Any] = field(default_factory=list)
    actions: list[np.ndarray] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    values: list[float] = field(default_factory=list)
    log_probs: list[float] = field(default_factory=list)
    initial_state: np.ndarray | None = None

    def close(self, terminated: bool, bootstrap_obs: Any, policy_version: int, truncated: bool) -> Trajectory:
        return Trajectory(
            observations=stack_obs(self.observations),
            actions=np.stack(self.actions),
            rewards=np.asarray(self.rewards, dtype=np.float32),
            values=np.asarray(self.values, dtype=np.float32),
            log_probs=np.asarray(self.log_probs, dtype=np.float32),
            terminated=terminated,
            bootstrap_obs=None if terminated else copy_row(bootstrap_obs),
            policy_version=policy_version,
            truncated=truncated,
            initial_state=self.initial_state,
        )


def stack_obs(observations: Sequence[Any]) -> ObsArray:
    """Stack per-step observations (arrays, or dicts of arrays) along a new first axis."""
    if isinstance(observations[0], dict):
        return {key: np.stack([obs[key] for obs in observations]) for key in observations[0]}
    return np.stack(observations)


def concat_obs(observations: Sequence[ObsArray]) -> ObsArray:
    """Concatenate batches of observations (arrays, or dicts of arrays) along the first axis."""
    if isinstance(observations[0], dict):
        return {key: np.concatenate([obs[key] for obs in observations]) for key in observations[0]}  # type: ignore[index]
    return np.concatenate(observations)  # type: ignore[arg-type]


def copy_row(obs: Any) -> Any:
    """A copy of one observation (an array, or a dict of arrays)."""
    if isinstance(obs, dict):
        return {key: np.array(value, copy=True) for key, value in obs.items()}
    return np.array(obs, copy=True)


def _row(obs: ObsArray, env_idx: int) -> Any:
    if isinstance(obs, dict):
        return {key: value[env_idx] for key, value in obs.items()}
    return obs[env_idx]


class AgentEpisodeBuffer:
    """Whole trajectories of one agent, from ``n_envs`` env copies.

    :param n_envs: Number of env copies feeding the buffer.
    :param rollout_len: Cut the open trajectory of a copy each time the agent's steps recorded from that copy reach a
        multiple of ``rollout_len``, counted across its episode ends (SB3's rollout of ``n_steps`` per env): a 6-step
        episode and ``rollout_len=4`` give chunks of 4, 2 (the episode ends), 2 (the count reaches 8), 4 (12, the
        episode ends). A cut chunk bootstraps from V(next obs). A copy's count leaves out the steps of a trajectory
        that ``drop_open`` forgets (they never train), so the agent's kept transitions from each copy are a multiple
        of ``rollout_len`` at every cut. None: trajectories end only with the agent's episode.
    :param max_buffered_episodes: At most this many finished trajectories wait for an update; more are
        rejected and counted in ``rejected_episodes``. None: unbounded.
    :param version_stamp: The policy version a trajectory carries: ``"episode_end"``, the version current when it
        ends (the reference stamps a trajectory when it receives it), or ``"first_step"``, the version of its first
        step (the oldest policy that acted in it: stricter, it drops more of the episodes that span an update).
    """

    def __init__(
        self,
        n_envs: int,
        rollout_len: int | None = None,
        max_buffered_episodes: int | None = None,
        version_stamp: VersionStamp = "episode_end",
    ) -> None:
        if version_stamp not in VERSION_STAMPS:
            raise ValueError(f"version_stamp must be one of {VERSION_STAMPS}, got {version_stamp!r}")
        if rollout_len is not None and rollout_len < 1:
            raise ValueError(f"rollout_len must be a positive number of steps or None, got {rollout_len}")
        if max_buffered_episodes is not None and max_buffered_episodes < 1:
            raise ValueError(f"max_buffered_episodes must be positive or None, got {max_buffered_episodes}")
        self.n_envs = n_envs
        self.rollout_len = rollout_len
        self.max_buffered_episodes = max_buffered_episodes
        self.version_stamp = version_stamp
        self._open: list[_OpenTrajectory | None] = [None] * n_envs
        # Per copy: the agent's steps recorded since the last rollout_len cut, across episode ends.
        self.steps_since_cut = [0] * n_envs
        self.finished: deque[Trajectory] = deque()
        self.stale_episodes_dropped = 0
        self.rejected_episodes = 0

    def add(
        self,
        acted: np.ndarray,
        obs: ObsArray,
        actions: np.ndarray,
        rewards: np.ndarray,
        values: np.ndarray,
        log_probs: np.ndarray,
        terminations: np.ndarray,
        truncations: np.ndarray,
        next_obs: ObsArray,
        final_obs: dict[int, Any],
        policy_version: int,
        max_version_lag: int | None = None,
        initial_states: np.ndarray | None = None,
    ) -> None:
        """Record one vectorized step of this agent. Every array has ``n_envs`` rows.

        :param acted: Which copies the agent acted in; the other rows are ignored.
        :param obs: The observations the agent acted on.
        :param next_obs: The observations it acts on next (the bootstrap of a trajectory cut by ``rollout_len``).
        :param final_obs: ``{env_idx: observation}`` for the copies where the agent's episode ended in this step
            (the bootstrap of a truncated trajectory; if the env gave none, the last observation stands in). The
            buffer keeps a copy: the env may reuse its arrays.
        :param policy_version: The version of the policy that acted.
        :param max_version_lag: Used to make room for new trajectories when the buffer is full: stale ones go first.
        :param initial_states: A recurrent policy's hidden states before this step, one row per copy: a trajectory
            that opens here keeps its row (``Trajectory.initial_state``).
        """
        for env_idx in np.flatnonzero(acted).tolist():
            trajectory = self._open[env_idx]
            if trajectory is None:
                trajectory = self._open[env_idx] = _OpenTrajectory(policy_version)
                if initial_states is not None:
                    trajectory.initial_state = np.array(initial_states[env_idx], copy=True)
            trajectory.observations.append(_row(obs, env_idx))
            trajectory.actions.append(actions[env_idx])
            trajectory.rewards.append(float(rewards[env_idx]))
            trajectory.values.append(float(values[env_idx]))
            trajectory.log_probs.append(float(log_probs[env_idx]))
            ended = self._close_ended(
                env_idx, terminations[env_idx], truncations[env_idx], final_obs, policy_version, max_version_lag
            )
            if self.rollout_len is None:
                continue
            self.steps_since_cut[env_idx] += 1
            if self.steps_since_cut[env_idx] >= self.rollout_len:
                self.steps_since_cut[env_idx] = 0
                if not ended:
                    self._finish(env_idx, False, _row(next_obs, env_idx), policy_version, max_version_lag, truncated=False)

    def credit(
        self,
        rows: np.ndarray,
        rewards: np.ndarray,
        terminations: np.ndarray,
        truncations: np.ndarray,
        final_obs: dict[int, Any],
        policy_version: int,
        max_version_lag: int | None = None,
    ) -> None:
        """Rewards and episode ends that reach the agent in copies where it did not act (in a turn-based env, during
        the other players' moves): they belong to its last move there. The reward is added to the last transition of
        the open trajectory in each of ``rows``, and a termination or truncation closes that trajectory (a truncated
        one bootstraps from ``final_obs``). Copies without an open trajectory (the agent has not moved in this
        episode yet) are ignored."""
        for env_idx in np.flatnonzero(rows).tolist():
            trajectory = self._open[env_idx]
            if trajectory is None:
                continue
            trajectory.rewards[-1] += float(rewards[env_idx])
            self._close_ended(env_idx, terminations[env_idx], truncations[env_idx], final_obs, policy_version, max_version_lag)

    def _close_ended(
        self,
        env_idx: int,
        terminated: bool,
        truncated: bool,
        final_obs: dict[int, Any],
        policy_version: int,
        max_version_lag: int | None,
    ) -> bool:
        """Close copy ``env_idx``'s open trajectory if its episode ended: terminated, or truncated (bootstrapping from
        ``final_obs``, else from the last observation). Returns whether it did."""
        if terminated:
            self._finish(env_idx, True, None, policy_version, max_version_lag, truncated=False)
            return True
        if truncated:
            bootstrap = final_obs.get(env_idx)
            if bootstrap is None:
                trajectory = self._open[env_idx]
                assert trajectory is not None
                bootstrap = trajectory.observations[-1]
            self._finish(env_idx, False, bootstrap, policy_version, max_version_lag, truncated=True)
            return True
        return False

    def _finish(
        self,
        env_idx: int,
        terminated: bool,
        bootstrap_obs: Any,
        policy_version: int,
        max_version_lag: int | None,
        truncated: bool,
    ) -> None:
        trajectory = self._open[env_idx]
        assert trajectory is not None
        self._open[env_idx] = None
        if self.max_buffered_episodes is not None and len(self.finished) >= self.max_buffered_episodes:
            if max_version_lag is not None:
                self.drop_stale(policy_version, max_version_lag)
            if len(self.finished) >= self.max_buffered_episodes:
                self.rejected_episodes += 1
                return
        stamp = trajectory.policy_version if self.version_stamp == "first_step" else policy_version
        self.finished.append(trajectory.close(terminated, bootstrap_obs, stamp, truncated))

    def drop_open(self, env_idx: int | None = None) -> int:
        """Forget the trajectories in progress: of copy ``env_idx`` (its episode was lost), or of every copy (they were
        reset behind the buffer's back). Returns how many were dropped.

        Their steps leave the copy's ``rollout_len`` count too, so its next cut comes when its kept steps reach the next
        multiple: an update of ``rollout_len * n_envs`` transitions then takes whole rollouts, not a leftover."""
        indices = range(self.n_envs) if env_idx is None else [env_idx]
        dropped = 0
        for i in indices:
            trajectory = self._open[i]
            if trajectory is not None:
                dropped += 1
                if self.rollout_len is not None:
                    # The open trajectory began at or after the copy's last cut, so the count stays >= 0.
                    self.steps_since_cut[i] -= len(trajectory.rewards)
            self._open[i] = None
        return dropped

    def end_rollout(self) -> None:
        """Start every copy's next ``rollout_len`` rollout now, at an episode end of every copy (IPPO's
        ``align_rollouts``): its next cut comes ``rollout_len`` steps on, and nothing is cut here, since no trajectory
        is open."""
        assert all(trajectory is None for trajectory in self._open), "a rollout ends early only where every episode ended"
        self.steps_since_cut = [0] * self.n_envs

    @staticmethod
    def is_stale(trajectory: Trajectory, current_version: int, max_version_lag: int) -> bool:
        return current_version - trajectory.policy_version > max_version_lag

    def drop_stale(self, current_version: int, max_version_lag: int) -> int:
        """Drop (and count) every finished trajectory that is stale at ``current_version``. Returns how many."""
        fresh = deque(t for t in self.finished if not self.is_stale(t, current_version, max_version_lag))
        dropped = len(self.finished) - len(fresh)
        self.finished = fresh
        self.stale_episodes_dropped += dropped
        return dropped

    def fresh_counts(self, current_version: int, max_version_lag: int) -> tuple[int, int]:
        """Number of finished trajectories, and of their transitions, that are not stale at ``current_version``."""
        fresh = [len(t) for t in self.finished if not self.is_stale(t, current_version, max_version_lag)]
        return len(fresh), sum(fresh)

    def is_ready(self, n_episodes: int | None, n_steps: int | None, current_version: int, max_version_lag: int) -> bool:
        """Whether enough fresh finished trajectories wait: ``n_steps`` transitions if set, else ``n_episodes``."""
        episodes, steps = self.fresh_counts(current_version, max_version_lag)
        if n_steps is not None:
            return steps >= n_steps
        return n_episodes is not None and episodes >= n_episodes

    def is_blocked(self, n_episodes: int | None, n_steps: int | None, current_version: int, max_version_lag: int) -> bool:
        """Whether the buffer is full of fresh trajectories that still do not make an update due: new ones would be
        rejected and the versions cannot advance, so no update could ever come."""
        if self.max_buffered_episodes is None:
            return False
        episodes, _ = self.fresh_counts(current_version, max_version_lag)
        return episodes >= self.max_buffered_episodes and not self.is_ready(
            n_episodes, n_steps, current_version, max_version_lag
        )

    def drain(
        self, n_episodes: int | None, n_steps: int | None, current_version: int, max_version_lag: int
    ) -> list[Trajectory]:
        """Drop the stale trajectories, then take the oldest fresh ones: enough to cover ``n_steps`` transitions if
        set, else ``n_episodes`` trajectories if set, else all of them (a rollout that ended early, at an episode end
        of every copy). The excess stays for the next update."""
        self.drop_stale(current_version, max_version_lag)
        batch: list[Trajectory] = []
        n_transitions = 0
        while self.finished:
            if n_steps is not None and n_transitions >= n_steps:
                break
            if n_steps is None and n_episodes is not None and len(batch) >= n_episodes:
                break
            trajectory = self.finished.popleft()
            batch.append(trajectory)
            n_transitions += len(trajectory)
        return batch
