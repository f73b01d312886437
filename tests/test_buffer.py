"""The per-agent episode buffer: what a trajectory holds, how it ends, version stamping, staleness, drain, bounds."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
import torch as th
from gymnasium import spaces
from stable_baselines3.common.policies import ActorCriticPolicy

from sb3_ippo.common.buffer import AgentEpisodeBuffer, Trajectory
from sb3_ippo.update.batch import build_batch
from tests.helpers import GAE_LAMBDA, GAMMA, settings



def observation(env_idx: int, t: int) -> np.ndarray:
    """An observation that says where it came from: ``[env copy, step]``."""
    return np.array([env_idx, t], dtype=np.float32)


class Feeder:
    """Feeds an :class:`AgentEpisodeBuffer` the way collection does, one vectorized step at a time.

    The agent's observation in copy ``i`` at step ``t`` is ``[i, t]``; its reward ``t``, its stored value
    ``10 * t``, its log-prob ``-t``, its action ``t % 3``.
    """

    def __init__(self, buffer: AgentEpisodeBuffer) -> None:
        self.buffer = buffer
        self.n_envs = buffer.n_envs
        self.t = np.zeros(self.n_envs, dtype=int)

    def obs(self) -> np.ndarray:
        return np.stack([observation(i, self.t[i]) for i in range(self.n_envs)])

    def step(
        self,
        policy_version: int = 0,
        acted: list[bool] | None = None,
        terminated: list[int] = (),  # type: ignore[assignment]
        truncated: list[int] = (),  # type: ignore[assignment]
        final_obs: dict[int, Any] | None = None,
        max_version_lag: int | None = None,
    ) -> None:
        """One step; ``terminated`` and ``truncated`` list the copies where the agent's episode ends."""
        obs = self.obs()
        acted_mask = np.ones(self.n_envs, dtype=bool) if acted is None else np.array(acted)
        ended = np.zeros(self.n_envs, dtype=bool)
        ended[list(terminated) + list(truncated)] = True
        next_t = np.where(ended, 0, self.t + 1)
        # After an episode end the copy resets: the next observation is the new episode's first.
        next_obs = np.stack([observation(i, next_t[i]) for i in range(self.n_envs)])
        terminations = np.zeros(self.n_envs, dtype=bool)
        terminations[list(terminated)] = True
        truncations = np.zeros(self.n_envs, dtype=bool)
        truncations[list(truncated)] = True
        self.buffer.add(
            acted_mask,
            obs,
            self.t % 3,
            self.t.astype(np.float32),
            10.0 * self.t,
            -self.t.astype(np.float32),
            terminations,
            truncations,
            next_obs,
            {} if final_obs is None else final_obs,
            policy_version,
            max_version_lag,
        )
        self.t = np.where(acted_mask, next_t, self.t)

    def episode(self, length: int, policy_version: int = 0, terminated: bool = True, **kwargs: Any) -> None:
        """A whole episode of ``length`` steps in copy 0 (one-copy buffers)."""
        for _ in range(length - 1):
            self.step(policy_version, **kwargs)
        end = {"terminated": [0]} if terminated else {"truncated": [0], "final_obs": {0: observation(0, 99)}}
        self.step(policy_version, **end, **kwargs)


def lengths(trajectories: Any) -> list[int]:
    return [len(trajectory) for trajectory in trajectories]


def versions(trajectories: Any) -> list[int]:
    return [trajectory.policy_version for trajectory in trajectories]


# --- What a trajectory holds and how it ends -------------------------------------------------------------------------


def test_a_trajectory_holds_the_agents_steps_in_order() -> None:
    buffer = AgentEpisodeBuffer(n_envs=1)

    Feeder(buffer).episode(3)

    (trajectory,) = buffer.finished
    np.testing.assert_array_equal(trajectory.observations, [[0, 0], [0, 1], [0, 2]])
    np.testing.assert_array_equal(trajectory.actions, [0, 1, 2])
    np.testing.assert_array_equal(trajectory.rewards, [0, 1, 2])
    np.testing.assert_array_equal(trajectory.values, [0, 10, 20])
    np.testing.assert_array_equal(trajectory.log_probs, [0, -1, -2])


def test_a_terminated_trajectory_has_no_bootstrap_observation() -> None:
    buffer = AgentEpisodeBuffer(n_envs=1)

    Feeder(buffer).episode(3, terminated=True)

    (trajectory,) = buffer.finished
    assert trajectory.terminated and not trajectory.truncated
    assert trajectory.bootstrap_obs is None


def test_a_truncated_trajectory_bootstraps_from_the_final_observation() -> None:
    buffer = AgentEpisodeBuffer(n_envs=1)
    feeder = Feeder(buffer)
    feeder.step()
    final = observation(0, 99)

    feeder.step(truncated=[0], final_obs={0: final})

    (trajectory,) = buffer.finished
    assert not trajectory.terminated and trajectory.truncated
    # Not the next observation, which belongs to the copy's next episode.
    np.testing.assert_array_equal(trajectory.bootstrap_obs, final)


def test_a_truncated_trajectory_without_final_observation_bootstraps_from_its_last_observation() -> None:
    buffer = AgentEpisodeBuffer(n_envs=1)
    feeder = Feeder(buffer)
    feeder.step()

    feeder.step(truncated=[0])

    (trajectory,) = buffer.finished
    np.testing.assert_array_equal(trajectory.bootstrap_obs, observation(0, 1))


def test_the_bootstrap_observation_is_a_copy_of_what_the_env_returned() -> None:
    buffer = AgentEpisodeBuffer(n_envs=1)
    final = observation(0, 99)

    Feeder(buffer).step(truncated=[0], final_obs={0: final})
    final[:] = -1.0  # an env that reuses its observation array

    np.testing.assert_array_equal(buffer.finished[0].bootstrap_obs, observation(0, 99))


def test_an_agent_that_does_not_act_adds_nothing() -> None:
    buffer = AgentEpisodeBuffer(n_envs=2)
    feeder = Feeder(buffer)

    feeder.step(acted=[True, False])
    feeder.step(acted=[True, False], terminated=[0, 1], truncated=[])

    (trajectory,) = buffer.finished
    np.testing.assert_array_equal(trajectory.observations[:, 0], [0, 0])
    assert buffer.fresh_counts(current_version=0, max_version_lag=1) == (1, 2)


def test_each_env_copy_builds_its_own_trajectory() -> None:
    buffer = AgentEpisodeBuffer(n_envs=2)
    feeder = Feeder(buffer)

    feeder.step()
    feeder.step(terminated=[1])
    feeder.step(truncated=[0], final_obs={0: observation(0, 99)})

    assert [t.observations[0, 0] for t in buffer.finished] == [1, 0]
    assert lengths(buffer.finished) == [2, 3]


# --- GAE of the trajectory ends (against the formula for the last step) ----------------------------------------------


def tiny_policy() -> ActorCriticPolicy:
    th.manual_seed(0)
    return ActorCriticPolicy(spaces.Box(-np.inf, np.inf, (2,), np.float32), spaces.Discrete(3), lambda _: 3e-4, net_arch=[16])


@th.no_grad()
def value_of(policy: ActorCriticPolicy, obs: np.ndarray) -> float:
    return policy.predict_values(th.as_tensor(obs).reshape(1, -1)).item()


@pytest.mark.parametrize("terminated", [True, False])
def test_terminated_bootstraps_zero_and_truncated_bootstraps_the_value_of_the_final_observation(terminated: bool) -> None:
    policy = tiny_policy()
    buffer = AgentEpisodeBuffer(n_envs=1)
    Feeder(buffer).episode(4, terminated=terminated)
    (trajectory,) = buffer.finished

    batch = build_batch(policy, [trajectory], settings())

    bootstrap = 0.0 if terminated else value_of(policy, observation(0, 99))
    last_reward, last_value = trajectory.rewards[-1], value_of(policy, trajectory.observations[-1])
    assert batch.advantages[-1].item() == pytest.approx(last_reward + GAMMA * bootstrap - last_value, abs=1e-5)


# --- rollout_len chunks ----------------------------------------------------------------------------------------------


def test_rollout_len_cuts_chunks_that_bootstrap_from_the_next_observation() -> None:
    buffer = AgentEpisodeBuffer(n_envs=1, rollout_len=3)

    Feeder(buffer).episode(8, terminated=True)

    first, second, last = buffer.finished
    assert lengths(buffer.finished) == [3, 3, 2]
    assert not first.terminated and not second.terminated and last.terminated
    assert not any(chunk.truncated for chunk in buffer.finished)  # a cut is not a time limit: it always bootstraps
    np.testing.assert_array_equal(first.bootstrap_obs, observation(0, 3))
    np.testing.assert_array_equal(second.bootstrap_obs, observation(0, 6))
    np.testing.assert_array_equal(second.observations[0], observation(0, 3))


def test_an_episode_ending_on_a_chunk_boundary_ends_as_the_episode_ends() -> None:
    buffer = AgentEpisodeBuffer(n_envs=1, rollout_len=3)

    Feeder(buffer).episode(6, terminated=False)

    assert lengths(buffer.finished) == [3, 3]
    np.testing.assert_array_equal(buffer.finished[1].bootstrap_obs, observation(0, 99))


def test_cut_chunks_bootstrap_like_the_uncut_episode_under_one_step_td() -> None:
    # With gae_lambda = 0 an advantage is the one-step TD error r + gamma V(s') - V(s): bootstrapping a chunk
    # from V(next obs) must then give exactly the advantages of the uncut episode.
    policy = tiny_policy()
    chunked, whole = AgentEpisodeBuffer(n_envs=1, rollout_len=3), AgentEpisodeBuffer(n_envs=1)
    Feeder(chunked).episode(8, terminated=False)
    Feeder(whole).episode(8, terminated=False)

    from_chunks = build_batch(policy, list(chunked.finished), settings(gamma=GAMMA, gae_lambda=0.0))
    from_whole = build_batch(policy, list(whole.finished), settings(gamma=GAMMA, gae_lambda=0.0))

    np.testing.assert_allclose(from_chunks.advantages.numpy(), from_whole.advantages.numpy(), rtol=1e-6, atol=1e-6)


def test_a_cut_chunk_advantage_bootstraps_the_value_of_the_next_observation() -> None:
    policy = tiny_policy()
    buffer = AgentEpisodeBuffer(n_envs=1, rollout_len=3)
    Feeder(buffer).episode(8)
    first = buffer.finished[0]

    batch = build_batch(policy, [first], settings())

    values = [value_of(policy, obs) for obs in first.observations] + [value_of(policy, observation(0, 3))]
    deltas = [first.rewards[t] + GAMMA * values[t + 1] - values[t] for t in range(3)]
    expected = [sum((GAMMA * GAE_LAMBDA) ** k * deltas[t + k] for k in range(3 - t)) for t in range(3)]
    np.testing.assert_allclose(batch.advantages.numpy(), expected, rtol=1e-5, atol=1e-5)


def test_rollout_len_counts_each_copys_steps_across_episode_ends() -> None:
    # SB3's cadence: the copy's count runs on through episode ends. Cut at 4; the episode ends at 6 (2); the next
    # episode's first 2 steps reach 8, a cut (2); its last 4 reach 12, its end and a cut (4).
    buffer = AgentEpisodeBuffer(n_envs=1, rollout_len=4)
    feeder = Feeder(buffer)

    feeder.episode(6)
    feeder.episode(6)

    assert lengths(buffer.finished) == [4, 2, 2, 4]
    assert [chunk.terminated for chunk in buffer.finished] == [False, True, False, True]
    np.testing.assert_array_equal(buffer.finished[2].bootstrap_obs, observation(0, 2))


def test_rollout_len_counts_only_the_steps_the_agent_acted_in() -> None:
    # The agent's episode ends after 2 steps; it sits out 3 steps of the copy, then acts again: its count reaches 4
    # two steps into its next episode (a cut), not 4 steps of the copy after the last cut.
    buffer = AgentEpisodeBuffer(n_envs=1, rollout_len=4)
    feeder = Feeder(buffer)

    feeder.episode(2)
    for _ in range(3):
        feeder.step(acted=[False])
    for _ in range(6):
        feeder.step()

    assert lengths(buffer.finished) == [2, 2, 4]


def test_a_rollout_ended_with_the_episodes_starts_the_next_count_at_zero() -> None:
    # A 3-step episode, then the rollout ends with it (align_rollouts): the next episode of 6 is cut at 4 of its own
    # steps, not at 4 steps of the copy (which would cut it after 1), and drain takes every finished trajectory.
    buffer = AgentEpisodeBuffer(n_envs=1, rollout_len=4)
    feeder = Feeder(buffer)
    feeder.episode(3)

    buffer.end_rollout()
    feeder.episode(6)

    assert lengths(buffer.finished) == [3, 4, 2]
    assert lengths(buffer.drain(None, None, current_version=0, max_version_lag=1)) == [3, 4, 2]
    assert not buffer.finished


def test_a_forgotten_trajectory_leaves_its_copys_rollout_count() -> None:
    # After a cut at 4, the episode ends at 6 (a chunk of 2) and the next one is lost after 1 step (drop_open): the
    # next cut comes when the copy's kept steps reach 8, so each cut still closes whole rollouts of kept transitions.
    buffer = AgentEpisodeBuffer(n_envs=1, rollout_len=4)
    feeder = Feeder(buffer)
    feeder.episode(6)
    feeder.step()

    assert buffer.drop_open() == 1
    for _ in range(2):
        feeder.step()

    assert lengths(buffer.finished) == [4, 2, 2]


# --- Version stamping and staleness ----------------------------------------------------------------------------------


def test_a_trajectory_carries_the_version_of_the_policy_that_acted() -> None:
    buffer = AgentEpisodeBuffer(n_envs=1)
    feeder = Feeder(buffer)

    feeder.episode(2, policy_version=4)
    feeder.episode(2, policy_version=5)

    assert versions(buffer.finished) == [4, 5]


@pytest.mark.parametrize(("version_stamp", "expected"), [("first_step", 2), ("episode_end", 4)])
def test_a_trajectory_spanning_updates_carries_the_version_of_its_stamp(version_stamp: str, expected: int) -> None:
    buffer = AgentEpisodeBuffer(n_envs=1, version_stamp=version_stamp)  # type: ignore[arg-type]
    feeder = Feeder(buffer)

    feeder.step(policy_version=2)
    feeder.step(policy_version=3)
    feeder.step(policy_version=4, terminated=[0])

    assert versions(buffer.finished) == [expected]


def test_the_reference_stamps_a_trajectory_when_it_ends() -> None:
    assert AgentEpisodeBuffer(n_envs=1).version_stamp == "episode_end"


def test_an_unknown_version_stamp_is_refused() -> None:
    with pytest.raises(ValueError, match="version_stamp"):
        AgentEpisodeBuffer(n_envs=1, version_stamp="last_step")  # type: ignore[arg-type]


def test_a_full_buffer_of_too_few_transitions_is_blocked() -> None:
    buffer = AgentEpisodeBuffer(n_envs=1, max_buffered_episodes=2)
    feeder = Feeder(buffer)
    feeder.episode(3)
    assert not buffer.is_blocked(n_episodes=8, n_steps=10, current_version=0, max_version_lag=1)
    feeder.episode(3)

    assert buffer.is_blocked(n_episodes=8, n_steps=10, current_version=0, max_version_lag=1)
    assert not buffer.is_blocked(n_episodes=8, n_steps=6, current_version=0, max_version_lag=1)
    # Once stale, the trajectories would make room: not blocked.
    assert not buffer.is_blocked(n_episodes=8, n_steps=10, current_version=2, max_version_lag=1)


def test_stale_trajectories_are_dropped_counted_and_never_returned() -> None:
    buffer = AgentEpisodeBuffer(n_envs=1)
    feeder = Feeder(buffer)
    for version in (0, 1, 2, 3, 2):
        feeder.episode(2, policy_version=version)

    batch = buffer.drain(n_episodes=10, n_steps=None, current_version=3, max_version_lag=1)

    # 3 - 0 and 3 - 1 exceed the lag of 1; 3 - 2 does not.
    assert versions(batch) == [2, 3, 2]
    assert buffer.stale_episodes_dropped == 2
    assert not buffer.finished


def test_zero_version_lag_keeps_only_the_current_policys_data() -> None:
    buffer = AgentEpisodeBuffer(n_envs=1)
    feeder = Feeder(buffer)
    feeder.episode(2, policy_version=0)
    feeder.episode(2, policy_version=1)

    batch = buffer.drain(n_episodes=10, n_steps=None, current_version=1, max_version_lag=0)

    assert versions(batch) == [1]
    assert buffer.stale_episodes_dropped == 1


def test_stale_trajectories_do_not_count_towards_an_update() -> None:
    buffer = AgentEpisodeBuffer(n_envs=1)
    feeder = Feeder(buffer)
    feeder.episode(5, policy_version=0)
    feeder.episode(5, policy_version=2)

    assert buffer.fresh_counts(current_version=2, max_version_lag=1) == (1, 5)
    assert not buffer.is_ready(n_episodes=2, n_steps=None, current_version=2, max_version_lag=1)
    assert buffer.is_ready(n_episodes=1, n_steps=None, current_version=2, max_version_lag=1)
    assert not buffer.is_ready(n_episodes=1, n_steps=6, current_version=2, max_version_lag=1)


# --- Drain -----------------------------------------------------------------------------------------------------------


def test_drain_takes_the_oldest_n_episodes_and_the_excess_stays() -> None:
    buffer = AgentEpisodeBuffer(n_envs=1)
    feeder = Feeder(buffer)
    for length in (2, 3, 4, 5, 6):
        feeder.episode(length)

    batch = buffer.drain(n_episodes=3, n_steps=None, current_version=0, max_version_lag=1)

    assert lengths(batch) == [2, 3, 4]
    assert lengths(buffer.finished) == [5, 6]
    assert lengths(buffer.drain(n_episodes=3, n_steps=None, current_version=0, max_version_lag=1)) == [5, 6]


def test_drain_takes_the_oldest_episodes_that_cover_n_steps_and_the_excess_stays() -> None:
    buffer = AgentEpisodeBuffer(n_envs=1)
    feeder = Feeder(buffer)
    for length in (3, 4, 5, 2):
        feeder.episode(length)

    batch = buffer.drain(n_episodes=1, n_steps=6, current_version=0, max_version_lag=1)

    assert lengths(batch) == [3, 4]
    assert lengths(buffer.finished) == [5, 2]


def test_drain_leaves_open_trajectories_alone() -> None:
    buffer = AgentEpisodeBuffer(n_envs=1)
    feeder = Feeder(buffer)
    feeder.episode(2)
    feeder.step()
    feeder.step()

    buffer.drain(n_episodes=1, n_steps=None, current_version=0, max_version_lag=1)
    feeder.step(terminated=[0])

    assert lengths(buffer.finished) == [3]


def test_drop_open_forgets_the_trajectories_in_progress() -> None:
    buffer = AgentEpisodeBuffer(n_envs=1)
    feeder = Feeder(buffer)
    feeder.step()
    feeder.step()

    buffer.drop_open()
    feeder.step(terminated=[0])

    assert lengths(buffer.finished) == [1]


# --- Bounded memory --------------------------------------------------------------------------------------------------


def test_a_full_buffer_rejects_and_counts_new_trajectories() -> None:
    buffer = AgentEpisodeBuffer(n_envs=1, max_buffered_episodes=2)
    feeder = Feeder(buffer)

    for length in (2, 3, 4, 5):
        feeder.episode(length)

    assert lengths(buffer.finished) == [2, 3]
    assert buffer.rejected_episodes == 2


def test_a_full_buffer_makes_room_by_dropping_stale_trajectories_first() -> None:
    buffer = AgentEpisodeBuffer(n_envs=1, max_buffered_episodes=2)
    feeder = Feeder(buffer)
    feeder.episode(2, policy_version=0)
    feeder.episode(3, policy_version=2)

    feeder.episode(4, policy_version=2, max_version_lag=1)

    assert lengths(buffer.finished) == [3, 4]
    assert buffer.stale_episodes_dropped == 1
    assert buffer.rejected_episodes == 0


def test_a_drained_buffer_accepts_trajectories_again() -> None:
    buffer = AgentEpisodeBuffer(n_envs=1, max_buffered_episodes=1)
    feeder = Feeder(buffer)
    feeder.episode(2)
    buffer.drain(n_episodes=1, n_steps=None, current_version=0, max_version_lag=1)

    feeder.episode(3)

    assert lengths(buffer.finished) == [3]
    assert buffer.rejected_episodes == 0


@pytest.mark.parametrize("kwargs", [{"rollout_len": 0}, {"max_buffered_episodes": 0}])
def test_invalid_bounds_are_refused(kwargs: dict[str, int]) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        AgentEpisodeBuffer(n_envs=1, **kwargs)


# --- Dict observations -----------------------------------------------------------------------------------------------


def test_dict_observations_are_stacked_per_key() -> None:
    buffer = AgentEpisodeBuffer(n_envs=2)
    obs = {"position": np.arange(4, dtype=np.float32).reshape(2, 2), "mode": np.array([1, 2])}
    final = {"position": np.array([9.0, 9.0], dtype=np.float32), "mode": np.int64(0)}
    for end in (False, True):
        buffer.add(
            np.array([True, True]),
            obs,
            np.array([0, 1]),
            np.zeros(2),
            np.zeros(2),
            np.zeros(2),
            np.array([end, False]),
            np.array([False, end]),
            obs,
            {1: final} if end else {},
            0,
        )

    terminated, truncated = buffer.finished
    assert isinstance(terminated, Trajectory) and isinstance(terminated.observations, dict)
    np.testing.assert_array_equal(terminated.observations["position"], [[0, 1], [0, 1]])
    np.testing.assert_array_equal(truncated.observations["mode"], [2, 2])
    np.testing.assert_array_equal(truncated.bootstrap_obs["position"], [9.0, 9.0])
