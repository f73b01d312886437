"""Training runs with each hyperparameter, what each one promises, the logger keys and the errors on bad input
(mirrors SB3's test_run.py).

Most tests train on :class:`DyingAgentsEnv`: agents ``agent_0``, ``agent_1``, ``agent_2`` leave after 2, 4 and 6
steps, so each episode gives one trajectory of length 2, 4 and 6, and lasts 6 env steps.
"""

from __future__ import annotations

import csv
import math
import pathlib
from typing import Any

import gymnasium as gym
from gymnasium import spaces
import numpy as np
import pytest
import torch as th
from stable_baselines3.common.callbacks import BaseCallback
from stable_baselines3.common.logger import configure
from stable_baselines3.common.vec_env import DummyVecEnv
from stable_baselines3.dqn.policies import DQNPolicy

import sb3_ippo.update.runners as runners_module
from sb3_ippo import IPPO, make_vec_env
from sb3_ippo.ippo.networks import initial_log_std
from tests.envs import DyingAgentsEnv, HeterogeneousEnv, VariableLengthEnv
from tests.helpers import (
    ALGORITHMS,
    EPISODE_LENGTH,
    TRAJECTORY_LENGTHS,
    make_algo_vec_env,
    make_model,
    parameters,
    record_logs,
    record_trajectories,
)


def adam_steps(model: IPPO, agent: str) -> int:
    """How many optimizer steps the agent's policy has taken."""
    steps = {int(state["step"]) for state in model.policies[agent].optimizer.state.values()}
    assert len(steps) == 1
    return steps.pop()


def spy_on_batches(monkeypatch: pytest.MonkeyPatch, model: IPPO) -> list[tuple[int, list[int]]]:
    """Record every agent's training batch: ``(policy_version at the update, [version of each trajectory in it])``."""
    seen: list[tuple[int, list[int]]] = []
    build_batch, stacked_build_batch = runners_module.build_batch, runners_module.stacked_build_batch

    def spy(*args: Any, **kwargs: Any) -> Any:
        trajectories = args[1] if len(args) > 1 else kwargs["trajectories"]
        seen.append((model.policy_version, [trajectory.policy_version for trajectory in trajectories]))
        return build_batch(*args, **kwargs)

    def stacked_spy(*args: Any, **kwargs: Any) -> Any:
        for trajectories in args[1] if len(args) > 1 else kwargs["trajectories"]:
            seen.append((model.policy_version, [trajectory.policy_version for trajectory in trajectories]))
        return stacked_build_batch(*args, **kwargs)

    monkeypatch.setattr(runners_module, "build_batch", spy)
    monkeypatch.setattr(runners_module, "stacked_build_batch", stacked_spy)
    return seen


# ----------------------------------------------------------------------------------------------------------------
# When an update is due and what it drains
# ----------------------------------------------------------------------------------------------------------------


def test_n_episodes_drains_exactly_n_episodes_per_agent_and_keeps_the_excess() -> None:
    # Two copies finish together: after 2 episodes each, every agent has 4 trajectories, one more than needed.
    model = make_model(make_vec_env(DyingAgentsEnv, n_envs=2), n_episodes=3)
    model.learn(2 * 2 * EPISODE_LENGTH)
    assert model.policy_version == 1
    for agent, length in TRAJECTORY_LENGTHS.items():
        assert model.update_stats[agent].n_trajectories == 3
        assert model.update_stats[agent].n_transitions == 3 * length
        assert len(model.buffers[agent].finished) == 1


def test_n_steps_drains_just_enough_episodes_to_cover_n_steps() -> None:
    # agent_0 needs 5 of its 2-step trajectories to cover 10 transitions; n_episodes is then ignored.
    model = make_model(n_steps=10, n_episodes=1)
    model.learn(5 * EPISODE_LENGTH)
    assert model.policy_version == 1
    for agent, length in TRAJECTORY_LENGTHS.items():
        n_transitions = model.update_stats[agent].n_transitions
        assert 10 <= n_transitions < 10 + length, agent
    assert model.update_stats["agent_0"].n_trajectories == 5


def test_no_update_before_every_agent_that_acted_has_n_episodes() -> None:
    model = make_model(n_episodes=2)
    model.learn(2 * EPISODE_LENGTH - 1)
    assert model.policy_version == 0
    model.learn(1, reset_num_timesteps=False)
    assert model.policy_version == 1


@pytest.mark.parametrize("batch_size", [None, 4, 5])
def test_batch_size_sets_the_gradient_steps_of_each_pass(batch_size: int | None) -> None:
    n_epochs = 3
    model = make_model(n_episodes=2, n_epochs=n_epochs, batch_size=batch_size, target_kl=None)
    model.learn(2 * EPISODE_LENGTH)
    assert model.policy_version == 1
    for agent, length in TRAJECTORY_LENGTHS.items():
        n_transitions = 2 * length
        minibatches = 1 if batch_size is None else math.ceil(n_transitions / batch_size)
        assert adam_steps(model, agent) == n_epochs * minibatches, agent


def test_target_kl_none_runs_every_pass() -> None:
    model = make_model(n_epochs=5, target_kl=None, learning_rate=0.05)
    model.learn(2 * EPISODE_LENGTH)
    assert {stats.n_epochs_run for stats in model.update_stats.values()} == {5}


@pytest.mark.parametrize(("kl_stop", "expected_steps"), [("after_step", 2), ("before_step", 1)])
def test_target_kl_stops_all_remaining_passes_of_an_agent(kl_stop: str, expected_steps: int) -> None:
    # The first pass has a ratio of exactly 1 (fresh log-probs); after a large step the KL exceeds any tiny target:
    # the second pass's step is taken and then the passes stop (the reference), or it is skipped (SB3).
    model = make_model(n_epochs=5, target_kl=1e-9, learning_rate=0.05, kl_stop=kl_stop)
    model.learn(2 * EPISODE_LENGTH)
    for agent, stats in model.update_stats.items():
        assert stats.n_epochs_run == expected_steps, agent
        assert adam_steps(model, agent) == expected_steps, agent


def test_shuffle_minibatches_changes_the_order_of_the_gradient_steps() -> None:
    def trained(shuffle: bool) -> dict[str, dict[str, th.Tensor]]:
        model = make_model(n_epochs=3, batch_size=2, target_kl=None, shuffle_minibatches=shuffle, learning_rate=0.01)
        model.learn(2 * EPISODE_LENGTH)
        return parameters(model)

    in_order, in_order_again, shuffled = trained(False), trained(False), trained(True)
    assert all(th.equal(in_order["agent_2"][name], p) for name, p in in_order_again["agent_2"].items())
    assert any(not th.equal(in_order["agent_2"][name], p) for name, p in shuffled["agent_2"].items())


def test_rollout_len_cuts_trajectories_into_chunks() -> None:
    # rollout_len=2 on one copy: an update of 2 transitions per agent (n_steps = rollout_len * n_envs; n_episodes is
    # ignored) once every agent that acted has them. agent_0 acts in the first 2 steps of each 6-step episode, so the
    # updates come after steps 2 and 8, and its partners' chunks wait in between.
    model = make_model(rollout_len=2, n_episodes=None)
    model.learn(2 * EPISODE_LENGTH)
    assert model.policy_version == 2
    for agent, stats in model.update_stats.items():
        assert (stats.n_trajectories, stats.n_transitions) == (1, 2), agent
    # agent_2's two 6-step episodes made 6 chunks: 2 trained, 4 wait.
    assert [len(chunk) for chunk in model.buffers["agent_2"].finished] == [2, 2, 2, 2]


@pytest.mark.parametrize("n_steps", [None, 8])
def test_rollout_len_updates_every_rollout_len_steps_of_each_copy_on_fresh_data(n_steps: int | None) -> None:
    # SB3's cadence: 2 copies whose episodes last 2 to 9 steps, rollout_len=4: an update every 4 steps of each copy (8
    # env steps) on 8 transitions per agent (n_steps defaults to rollout_len * n_envs), all collected by the current
    # policy: with first-step stamps, no trajectory of a batch began before the last update.
    env = make_vec_env(lambda: VariableLengthEnv(n_agents=2, min_length=2, max_length=9), n_envs=2, seed=3)
    model = make_model(env, rollout_len=4, n_steps=n_steps, n_episodes=None, version_stamp="first_step", async_training=False)
    updates: list[tuple[int, dict[str, tuple[int, set[int]]]]] = []
    prepare_update = model._prepare_update

    def recording_prepare_update() -> Any:
        job = prepare_update()
        batches = {agent: (sum(map(len, batch)), {t.policy_version for t in batch}) 
                   for agent, batch in job.trajectories.items()}
        updates.append((model.num_timesteps, batches))
        return job

    model._prepare_update = recording_prepare_update  # type: ignore[method-assign]
    model.learn(24)

    assert [at for at, _ in updates] == [8, 16, 24]
    for version, (_, batches) in enumerate(updates):
        assert batches == {agent: (8, {version}) for agent in model.possible_agents}
    assert model.stale_episodes_dropped == 0
    assert all(not buffer.finished for buffer in model.buffers.values())


@pytest.mark.parametrize(
    ("rollout_len", "align_rollouts", "updates_at", "lengths"),
    [
        # 3-step episodes: a rollout of 4 ends with the first (3 + 3 > 4), a rollout of 7 with the second (6 + 3 > 7).
        (4, True, [6, 12, 18, 24], {3}),
        (7, True, [12, 24], {3}),
        # SB3's cadence to the step: rollouts of 4 cut every other episode.
        (4, False, [8, 16, 24], {1, 2, 3}),
    ],
)
def test_rollouts_end_at_an_episode_end_of_every_copy_where_another_episode_would_not_fit(
    rollout_len: int, align_rollouts: bool, updates_at: list[int], lengths: set[int]
) -> None:
    env = make_vec_env(lambda: VariableLengthEnv(n_agents=2, min_length=3, max_length=3), n_envs=2, seed=3)
    model = make_model(env, rollout_len=rollout_len, align_rollouts=align_rollouts, n_episodes=None, async_training=False)
    updates: list[int] = []
    drained = record_trajectories(model)
    prepare_update = model._prepare_update

    def recording_prepare_update() -> Any:
        updates.append(model.num_timesteps)
        return prepare_update()

    model._prepare_update = recording_prepare_update  # type: ignore[method-assign]
    model.learn(24)

    assert updates == updates_at
    assert {len(trajectory) for trajectory in drained} == lengths
    assert model.stale_episodes_dropped == 0 and all(not buffer.finished for buffer in model.buffers.values())


def test_max_episode_steps_truncates_episodes() -> None:
    model = make_model(max_episode_steps=3, n_episodes=2)
    output = record_logs(model)
    model.learn(4 * 3)
    assert model.ep_info_buffer is not None and len(model.ep_info_buffer) == 4
    assert {info["l"] for info in model.ep_info_buffer} == {3}
    assert output.dumps[-1]["rollout/ep_len_mean"] == 3
    # agent_0 still dies after 2 steps, the others are cut at 3.
    assert [model.update_stats[agent].n_transitions for agent in TRAJECTORY_LENGTHS] == [4, 6, 6]


# ----------------------------------------------------------------------------------------------------------------
# Version stamping: stale leftovers are dropped and counted, never trained
# ----------------------------------------------------------------------------------------------------------------


def test_max_version_lag_0_drops_leftover_episodes_as_stale(monkeypatch: pytest.MonkeyPatch) -> None:
    # Three copies finish together: 3 trajectories per agent, 2 drained, 1 left over, stale at the next update.
    model = make_model(make_vec_env(DyingAgentsEnv, n_envs=3), n_episodes=2, max_version_lag=0)
    drained_versions = spy_on_batches(monkeypatch, model)
    output = record_logs(model)
    model.learn(4 * 3 * EPISODE_LENGTH)
    assert model.policy_version == 4
    # One leftover per agent at updates 2, 3 and 4.
    assert model.stale_episodes_dropped == 3 * 3
    assert [dump["rollout/stale_episodes_dropped"] for dump in output.dumps] == [0, 3, 6, 9]
    assert len(drained_versions) == 4 * 3  # 4 updates of 3 agents
    for version, trajectory_versions in drained_versions:
        assert trajectory_versions == [version, version]


def test_max_version_lag_1_trains_on_leftovers_one_update_old(monkeypatch: pytest.MonkeyPatch) -> None:
    model = make_model(make_vec_env(DyingAgentsEnv, n_envs=3), n_episodes=2, max_version_lag=1)
    drained_versions = spy_on_batches(monkeypatch, model)
    model.learn(4 * 3 * EPISODE_LENGTH)
    assert model.stale_episodes_dropped == 0
    assert all(0 <= version - v <= 1 for version, versions in drained_versions for v in versions)
    assert any(version - v == 1 for version, versions in drained_versions for v in versions)


def test_max_buffered_episodes_rejects_and_counts_the_excess() -> None:
    # Three copies finish together, one trajectory fits: 2 per agent rejected at each episode end.
    model = make_model(make_vec_env(DyingAgentsEnv, n_envs=3), n_episodes=1, max_buffered_episodes=1)
    output = record_logs(model)
    model.learn(2 * 3 * EPISODE_LENGTH)
    assert model.policy_version == 2
    assert model.rejected_episodes == 2 * 3 * 2
    assert output.dumps[-1]["rollout/rejected_episodes"] == model.rejected_episodes


def test_max_buffered_episodes_that_cannot_cover_n_steps_of_bounded_trajectories_is_an_error() -> None:
    with pytest.raises(ValueError, match="cannot cover n_steps"):
        make_model(n_steps=100, max_buffered_episodes=2, max_episode_steps=25)
    with pytest.raises(ValueError, match="cannot cover n_steps"):
        make_model(n_steps=100, max_buffered_episodes=4, rollout_len=10)
    # rollout_len's own batch: 4 steps x 3 copies = 12 transitions, more than 2 pieces of at most 4 steps.
    with pytest.raises(ValueError, match=r"cannot cover n_steps \(12\)"):
        make_model(make_vec_env(DyingAgentsEnv, n_envs=3), rollout_len=4, n_episodes=None, max_buffered_episodes=2)


def test_a_buffer_full_of_too_few_transitions_stops_learn_with_a_clear_error() -> None:
    # agent_0's trajectories have 2 steps: two of them can never cover n_steps=10.
    model = make_model(n_steps=10, max_buffered_episodes=2)
    with pytest.raises(ValueError, match=r"agent_0.*no update could ever be due"):
        model.learn(20 * EPISODE_LENGTH)


def test_collection_stores_values_on_the_return_scale() -> None:
    model = make_model(normalize_returns=True)
    model.learn(2 * EPISODE_LENGTH)  # one update: the statistics are no longer the identity
    normalizer = model.return_normalizers["agent_2"]  # type: ignore[index]
    assert abs(float(normalizer.return_rms.mean)) > 1e-3
    model.learn(EPISODE_LENGTH, reset_num_timesteps=False)

    trajectory = model.buffers["agent_2"].finished[0]
    with th.no_grad():
        head = model.policies["agent_2"].predict_values(th.as_tensor(trajectory.observations)).flatten().numpy()
    np.testing.assert_allclose(trajectory.values, normalizer.denormalize(head), rtol=1e-5, atol=1e-5)


def test_max_buffered_episodes_below_n_episodes_is_an_error() -> None:
    # No update could ever be due: training would collect and reject forever.
    with pytest.raises(ValueError, match="max_buffered_episodes"):
        make_model(n_episodes=4, max_buffered_episodes=2)


# ----------------------------------------------------------------------------------------------------------------
# Normalization
# ----------------------------------------------------------------------------------------------------------------


def test_normalize_obs_statistics_follow_the_observations_of_training() -> None:
    model = make_model(normalize_obs=True)
    model.learn(2 * EPISODE_LENGTH)
    assert model.obs_normalizers is not None
    for agent, length in TRAJECTORY_LENGTHS.items():
        rms = model.obs_normalizers[agent].obs_rms
        assert rms.count == pytest.approx(2 * length, abs=1e-3)
        # The first coordinate is t / 6 for t = 0 .. length - 1.
        assert rms.mean[0] == pytest.approx(np.mean(np.arange(length) / EPISODE_LENGTH), rel=1e-4)


def test_normalize_obs_statistics_are_frozen_in_predict() -> None:
    model = make_model(normalize_obs=True)
    model.learn(2 * EPISODE_LENGTH)
    assert model.obs_normalizers is not None
    before = {agent: (n.obs_rms.mean.copy(), n.obs_rms.count) for agent, n in model.obs_normalizers.items()}
    model.predict({agent: np.ones((8, 2), dtype=np.float32) for agent in model.possible_agents})
    for agent, (mean, count) in before.items():
        np.testing.assert_array_equal(model.obs_normalizers[agent].obs_rms.mean, mean)
        assert model.obs_normalizers[agent].obs_rms.count == count


def test_normalize_returns_statistics_persist_across_updates() -> None:
    model = make_model(normalize_returns=True)
    assert model.return_normalizers is not None
    model.learn(2 * EPISODE_LENGTH)
    first = {agent: n.return_rms.count for agent, n in model.return_normalizers.items()}
    model.learn(2 * EPISODE_LENGTH, reset_num_timesteps=False)
    assert model.policy_version == 2
    for agent, length in TRAJECTORY_LENGTHS.items():
        assert first[agent] == pytest.approx(2 * length, abs=1e-3)
        assert model.return_normalizers[agent].return_rms.count == pytest.approx(4 * length, abs=1e-3)


# ----------------------------------------------------------------------------------------------------------------
# Every hyperparameter combination trains every agent
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "hyperparameters",
    [
        dict(),
        dict(n_steps=8),
        dict(batch_size=3),
        dict(batch_size=3, shuffle_minibatches=True),
        dict(normalize_obs=True, normalize_returns=True),
        dict(rollout_len=3),
        dict(rollout_len=4, n_steps=8, max_episode_steps=5),
        dict(recompute_values=False),
        dict(recompute_log_prob=False),
        dict(recompute_values=False, recompute_log_prob=False, normalize_returns=True),
        dict(clip_range_vf=0.1),
        dict(clip_range_vf=0.1, normalize_returns=True),
        dict(target_kl=None, ent_coef=0.01, max_grad_norm=None),
        dict(normalize_advantage=False),
        dict(learning_rate=lambda progress: 1e-3 * progress, clip_range=lambda progress: 0.2 * progress + 0.01),
        dict(max_version_lag=0, max_buffered_episodes=4),
        dict(async_training=True, normalize_obs=True, shuffle_minibatches=True, batch_size=4),
    ],
    ids=lambda hyperparameters: ",".join(hyperparameters) or "defaults",
)
@pytest.mark.parametrize("algo", ALGORITHMS, ids=lambda algo: algo.__name__)
def test_learn_updates_every_agent(hyperparameters: dict[str, Any], algo: type[IPPO]) -> None:
    model = make_model(make_algo_vec_env(algo, DyingAgentsEnv, n_envs=2), algo, **hyperparameters)
    before = parameters(model)
    model.learn(4 * 2 * EPISODE_LENGTH)
    assert model.policy_version >= 2
    for agent, params in parameters(model).items():
        assert all(th.isfinite(p).all() for p in params.values()), agent
        assert any(not th.equal(before[agent][name], p) for name, p in params.items()), agent


# ----------------------------------------------------------------------------------------------------------------
# Counters and logger keys
# ----------------------------------------------------------------------------------------------------------------


class CountingEnv(DyingAgentsEnv):
    """A :class:`DyingAgentsEnv` that counts its steps over all episodes."""

    def __init__(self) -> None:
        super().__init__()
        self.total_steps = 0

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        self.total_steps += 1
        return super().step(actions)


@pytest.mark.parametrize("algo", ALGORITHMS, ids=lambda algo: algo.__name__)
def test_num_timesteps_counts_env_steps_of_every_copy(algo: type[IPPO]) -> None:
    env = make_algo_vec_env(algo, CountingEnv, n_envs=3)
    model = make_model(env, algo)
    model.learn(45)
    assert model.num_timesteps == 45 == sum(env.get_attr("total_steps"))


@pytest.mark.parametrize("algo", ALGORITHMS, ids=lambda algo: algo.__name__)
def test_policy_version_increases_by_exactly_one_per_update(algo: type[IPPO]) -> None:
    versions: list[int] = []

    class VersionRecorder(BaseCallback):
        def _on_rollout_start(self) -> None:
            versions.append(self.model.policy_version)

        def _on_step(self) -> bool:
            return True

    model = make_model(make_algo_vec_env(algo, DyingAgentsEnv, n_envs=2), algo)
    output = record_logs(model)
    model.learn(5 * 2 * EPISODE_LENGTH, callback=VersionRecorder())
    assert model.policy_version == 5
    assert versions == list(range(5))
    assert [dump["train/policy_version"] for dump in output.dumps] == [1, 2, 3, 4, 5]


@pytest.mark.parametrize("algo", ALGORITHMS, ids=lambda algo: algo.__name__)
def test_logger_writes_the_documented_keys(tmp_path: pathlib.Path, algo: type[IPPO]) -> None:
    model = make_model(algo=algo)
    model.set_logger(configure(str(tmp_path), ["csv"]))
    model.learn(2 * 2 * EPISODE_LENGTH)
    with open(tmp_path / "progress.csv") as file:
        keys = set(next(csv.reader(file)))
    documented = {
        "rollout/ep_rew_mean",
        "rollout/ep_len_mean",
        "train/policy_loss",
        "train/value_loss",
        "train/approx_kl",
        "train/entropy_loss",
        "train/clip_fraction",
        "train/n_epochs_run",
        "train/policy_version",
        "rollout/stale_episodes_dropped",
        "time/fps",
    }
    per_agent = {f"rollout/{agent}/ep_rew_mean" for agent in TRAJECTORY_LENGTHS} | {
        f"train/{agent}/{name}"
        for agent in TRAJECTORY_LENGTHS
        for name in ("policy_loss", "value_loss", "approx_kl", "entropy_loss", "clip_fraction", "n_epochs_run")
    }
    assert documented | per_agent <= keys
    assert max(len(key) for key in keys) <= 36


def test_per_agent_keys_stay_within_36_characters_and_distinct_for_long_agent_ids() -> None:
    agents = {"blue_team_long_range_scout_number_0": 2, "blue_team_long_range_scout_number_1": None}
    model = make_model(DyingAgentsEnv(death_steps=agents, max_steps=4))
    output = record_logs(model)
    model.learn(2 * 4)
    keys = set(output.dumps[-1])
    assert max(len(key) for key in keys) <= 36
    # Two agents, and the group they form.
    assert len({key for key in keys if key.startswith("train/") and key.endswith("/policy_loss") and key.count("/") == 2}) == 3
    assert (
        len({key for key in keys if key.startswith("rollout/") and key.endswith("/ep_rew_mean") and key.count("/") == 2}) == 2
    )


@pytest.mark.parametrize("algo", ALGORITHMS, ids=lambda algo: algo.__name__)
def test_ep_rew_mean_is_the_mean_team_return(algo: type[IPPO]) -> None:
    model = make_model(algo=algo)
    output = record_logs(model)
    model.learn(2 * 2 * EPISODE_LENGTH)
    dump = output.dumps[-1]
    agent_means = [dump[f"rollout/{agent}/ep_rew_mean"] for agent in TRAJECTORY_LENGTHS]
    assert dump["rollout/ep_rew_mean"] == pytest.approx(sum(agent_means))
    assert dump["rollout/ep_rew_mean"] == pytest.approx(np.mean([info["r"] for info in model.ep_info_buffer]))


def test_policy_kwargs_reach_every_agents_policy() -> None:
    model = make_model(HeterogeneousEnv(agents=["discrete", "box"]), policy_kwargs=dict(net_arch=[7], log_std_init=-1.0))
    for agent, policy in model.policies.items():
        assert policy.mlp_extractor.policy_net[0].out_features == 7, agent
        assert policy.mlp_extractor.value_net[0].out_features == 7, agent
    assert th.all(model.policies["box"].log_std == -1.0)


def test_the_initial_std_is_sb3s_but_never_wider_than_half_the_action_range() -> None:
    low = np.array([0.0, -1.0, -0.01, -5.0, -np.inf, 2.0], dtype=np.float32)
    high = np.array([1.0, 1.0, 0.01, 5.0, np.inf, 2.0], dtype=np.float32)
    std = initial_log_std(spaces.Box(low, high)).exp()
    np.testing.assert_allclose(std.numpy(), [0.5, 1.0, 0.01, 1.0, 1.0, 1.0], rtol=1e-6)
    assert initial_log_std(spaces.Box(0.0, 1.0, (2, 3))).shape == (6,)  # one per dimension, as SB3's log_std


@pytest.mark.parametrize("algo", ALGORITHMS, ids=lambda algo: algo.__name__)
def test_box_actions_start_from_the_action_range_unless_the_user_sets_it(algo: type[IPPO]) -> None:
    action_space = spaces.Box(np.array([0.0, -1.0], np.float32), np.array([1.0, 1.0], np.float32))
    model = make_model(DyingAgentsEnv(action_space=action_space), algo=algo)
    for policy in model.policies.values():
        np.testing.assert_allclose(policy.log_std.detach().numpy(), [np.log(0.5), 0.0], rtol=1e-6)
    assert model.policy_kwargs == dict(net_arch=[16])  # what was set (make_model's), as saved
    heterogeneous = make_model(HeterogeneousEnv(agents=["discrete", "box"]), algo=algo)
    assert not hasattr(heterogeneous.policies["discrete"], "log_std")
    chosen = make_model(DyingAgentsEnv(action_space=action_space), algo=algo, policy_kwargs=dict(log_std_init=-2.0))
    assert all(th.all(policy.log_std == -2.0) for policy in chosen.policies.values())
    with_sde = make_model(DyingAgentsEnv(action_space=action_space), algo=algo, use_sde=True)
    assert all(th.all(policy.log_std == 0.0) for policy in with_sde.policies.values())  # gSDE's matrix: SB3's value
    shared = make_model(DyingAgentsEnv(action_space=action_space), algo=algo, share_parameters=True)
    np.testing.assert_allclose(shared.policies["agent_0"].log_std.detach().numpy(), [np.log(0.5), 0.0], rtol=1e-6)


# ----------------------------------------------------------------------------------------------------------------
# predict
# ----------------------------------------------------------------------------------------------------------------


def test_predict_answers_single_and_batched_observations() -> None:
    model = make_model()
    single, state = model.predict({agent: np.array([0.5, 1.0], dtype=np.float32) for agent in TRAJECTORY_LENGTHS})
    assert state is None
    assert all(np.shape(action) == () and model.action_spaces[agent].contains(int(action)) for agent, action in single.items())
    batched, _ = model.predict({agent: np.zeros((5, 2), dtype=np.float32) for agent in TRAJECTORY_LENGTHS})
    assert {agent: np.shape(action) for agent, action in batched.items()} == {agent: (5,) for agent in TRAJECTORY_LENGTHS}


def test_predict_skips_agents_missing_from_the_observation() -> None:
    actions, _ = make_model().predict({"agent_1": np.zeros(2, dtype=np.float32)})
    assert list(actions) == ["agent_1"]


def test_predict_gives_actions_in_each_agents_own_space() -> None:
    env = HeterogeneousEnv(agents=["discrete", "box", "multi_discrete", "multi_binary"])
    model = make_model(env)
    observations, _ = env.reset(seed=0)
    actions, _ = model.predict(observations, deterministic=True)
    for agent, action in actions.items():
        assert model.action_spaces[agent].contains(np.asarray(action, dtype=model.action_spaces[agent].dtype)), agent


def test_predict_with_an_observation_that_is_not_a_dict_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match=r"dict \{agent_id: observation\}"):
        make_model().predict(np.zeros((3, 2), dtype=np.float32))


def test_predict_with_an_unknown_agent_id_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="scout"):
        make_model().predict({"agent_0": np.zeros(2, dtype=np.float32), "scout": np.zeros(2, dtype=np.float32)})


# ----------------------------------------------------------------------------------------------------------------
# Bad input
# ----------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("env", "error", "message"),
    [
        (lambda: gym.make("CartPole-v1"), TypeError, "gymnasium"),
        (lambda: "simple_spread_v3", TypeError, "PettingZoo"),
        (lambda: None, ValueError, "environment"),
        (lambda: DummyVecEnv([lambda: gym.make("CartPole-v1")]), TypeError, "PettingZoo"),
        (lambda: object(), TypeError, "PettingZoo"),
    ],
    ids=["gymnasium env", "string", "None", "SB3 VecEnv", "object"],
)
def test_an_env_that_is_not_a_pettingzoo_env_is_a_clear_error(env: Any, error: type[Exception], message: str) -> None:
    with pytest.raises(error, match=message):
        IPPO("MlpPolicy", env())


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("n_episodes", 0),
        ("n_epochs", 0),
        ("n_steps", -1),
        ("batch_size", 0),
        ("batch_size", 2.5),
        ("rollout_len", 0),
        ("max_episode_steps", 0),
        ("max_buffered_episodes", 0),
        ("max_version_lag", -1),
        ("target_kl", 0.0),
        ("gamma", 1.5),
        ("gae_lambda", -0.1),
    ],
)
def test_a_bad_hyperparameter_is_a_clear_error(name: str, value: Any) -> None:
    with pytest.raises(ValueError, match=name):
        make_model(**{name: value})


def test_an_unknown_policy_name_is_a_clear_error() -> None:
    with pytest.raises(ValueError, match="TransformerPolicy"):
        IPPO("TransformerPolicy", DyingAgentsEnv())


def test_a_policy_class_that_is_not_an_actor_critic_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match="ActorCriticPolicy"):
        IPPO(DQNPolicy, DyingAgentsEnv())


def test_mlp_policy_with_dict_observations_names_the_agent_and_the_right_policy() -> None:
    with pytest.raises(ValueError, match=r"'dict'.*MultiInputPolicy"):
        make_model(HeterogeneousEnv(agents=["discrete", "dict"]))
