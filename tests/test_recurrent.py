"""Recurrent policies per agent (sb3-contrib's MlpLstmPolicy): hidden states in collection, whole-sequence updates,
predict's recurrent convention, save/load and export to RecurrentPPO."""

from __future__ import annotations

import warnings
from typing import Any

import numpy as np
import pytest
import torch as th
from sb3_contrib import RecurrentPPO
from sb3_contrib.common.recurrent.policies import RecurrentActorCriticPolicy

from sb3_ippo import IPPO, MultiAgentEvalCallback, evaluate_policy, make_vec_env
from sb3_ippo.update.recurrent import RecurrentGroupRunner, SequenceBatch, build_sequence_batch, sequence_minibatches
from sb3_ippo.update.runners import GroupRunner
from tests.envs import CueMemoryEnv, DyingAgentsEnv
from sb3_ippo.common.buffer import Trajectory
from tests.helpers import assert_same_parameters, parameters, settings

LSTM_KWARGS: dict[str, Any] = dict(net_arch=[16], lstm_hidden_size=8)


def recurrent_model(env: Any = None, **kwargs: Any) -> IPPO:
    params: dict[str, Any] = dict(
        n_episodes=2, n_epochs=2, policy_kwargs=LSTM_KWARGS, seed=0, async_training=False, batched=False
    )
    params.update(kwargs)
    return IPPO("MlpLstmPolicy", env if env is not None else DyingAgentsEnv(), **params)


def frozen(_progress_remaining: float) -> float:
    """A learning rate of 0 (as a schedule: the constant must be positive): updates leave the weights unchanged."""
    return 0.0


def joining_env() -> DyingAgentsEnv:
    """agent_0 dies after step 2, agent_2 joins after step 3; episodes of 6 steps."""
    return DyingAgentsEnv(death_steps={"agent_0": 2, "agent_1": None, "agent_2": None}, join_steps={"agent_2": 3})


def test_the_recurrent_aliases_give_each_agent_its_own_recurrent_policy() -> None:
    model = recurrent_model()
    policies = list(model.policies.values())
    assert all(isinstance(policy, RecurrentActorCriticPolicy) for policy in policies)
    assert len({id(policy) for policy in policies}) == len(policies)


def test_group_kwargs_mix_recurrent_and_feed_forward_groups() -> None:
    env = DyingAgentsEnv()
    model = IPPO(
        "MlpPolicy",
        env,
        groups={"memory": ["agent_0"], "plain": ["agent_1", "agent_2"]},
        group_kwargs={"memory": dict(policy="MlpLstmPolicy", policy_kwargs=LSTM_KWARGS)},
        n_episodes=2,
        n_epochs=2,
        policy_kwargs=dict(net_arch=[16]),
        seed=0,
        async_training=False,
    )
    assert isinstance(model.policies["agent_0"], RecurrentActorCriticPolicy)
    assert not isinstance(model.policies["agent_1"], RecurrentActorCriticPolicy)
    assert isinstance(model._runners["memory"], RecurrentGroupRunner)
    assert type(model._runners["plain"]) is GroupRunner
    model.learn(120)
    assert model.policy_version > 0


@pytest.mark.parametrize(("rollout_len", "share_parameters"), [(None, False), (2, False), (2, True)])
def test_recomputed_log_probs_and_values_equal_those_at_collection_while_the_weights_are_unchanged(
    rollout_len: int | None, share_parameters: bool
) -> None:
    # A learning rate of 0: the updates leave the weights as they are, so every trajectory, chunks cut by rollout_len and
    # agents that die or join mid-episode included, was collected by the network that recomputes it.
    env = make_vec_env(joining_env, n_envs=2, seed=0)
    model = recurrent_model(
        env, learning_rate=frozen, rollout_len=rollout_len, normalize_returns=False, share_parameters=share_parameters
    )
    drained = record_by_agent(model)
    model.learn(100)
    carried = [t for trajectories in drained.values() for t in trajectories if t.initial_state.any()]  # type: ignore[union-attr]
    assert bool(carried) == (rollout_len is not None)
    for agent, trajectories in drained.items():
        assert trajectories
        policy = model.policies[agent]
        batch = build_sequence_batch(policy, trajectories, settings(), None, None)  # type: ignore[arg-type]
        stored_log_probs = np.concatenate([t.log_probs for t in trajectories])
        stored_values = np.concatenate([t.values for t in trajectories])
        np.testing.assert_allclose(batch.batch.old_log_prob.numpy(), stored_log_probs, rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(batch.batch.old_values.numpy(), stored_values, rtol=1e-5, atol=1e-6)


def record_by_agent(model: IPPO) -> dict[str, list[Trajectory]]:
    """Every trajectory the model's updates drain from now on, by agent."""
    drained: dict[str, list[Trajectory]] = {agent: [] for agent in model.possible_agents}
    for agent, buffer in model.buffers.items():
        drain = buffer.drain

        def recording_drain(*args: Any, drain: Any = drain, agent: str = agent) -> list[Trajectory]:
            batch = drain(*args)
            drained[agent].extend(batch)
            return batch

        buffer.drain = recording_drain  # type: ignore[method-assign]
    return drained


def episode_step(trajectory: Trajectory) -> int:
    """The step of the episode at which a DyingAgentsEnv trajectory starts (its first observation is [t / 6, target])."""
    return round(float(np.asarray(trajectory.observations)[0, 0]) * 6)


def test_hidden_states_reset_exactly_at_each_agents_own_episode_start() -> None:
    # rollout_len=1: every step opens a trajectory, so each records the state the agent acted from at that step.
    model = recurrent_model(joining_env(), rollout_len=1, learning_rate=frozen, n_episodes=12)
    drained = record_by_agent(model)
    model.learn(60)
    starts = {"agent_0": 0, "agent_1": 0, "agent_2": 3}  # agent_2 joins after step 3: its episode starts there
    for agent, start in starts.items():
        assert drained[agent]
        for trajectory in drained[agent]:
            step = episode_step(trajectory)
            assert trajectory.initial_state is not None
            zero = not trajectory.initial_state.any()
            assert zero == (step == start), f"{agent} at step {step}: state {'zero' if zero else 'carried'}"


def test_a_piece_cut_on_the_rollout_cadence_starts_from_the_carried_state() -> None:
    # agent_2's 6-step episodes, rollout_len=4 counted across episode ends: pieces start at steps 0, 4 | 0, 2 | 0, ...
    # A piece that starts mid-episode (a cut) carries the state collection had there; one at an episode start is zeros.
    model = recurrent_model(rollout_len=4, n_steps=10**6, learning_rate=frozen)  # no update: every piece waits
    with pytest.warns(UserWarning, match="without a single update"):
        model.learn(4 * 6)
    pieces = list(model.buffers["agent_2"].finished)
    assert [(episode_step(t), len(t)) for t in pieces] == [(0, 4), (4, 2), (0, 2), (2, 4)] * 2
    for piece in pieces:
        assert piece.initial_state is not None
        assert piece.initial_state.any() == (episode_step(piece) != 0)


def test_a_dying_agents_state_is_zeroed_in_its_copy_while_the_others_carry_theirs() -> None:
    env = make_vec_env(joining_env, n_envs=2, seed=0)
    model = recurrent_model(env, n_episodes=100)  # no update within the run
    model.learn(2)  # one vectorized step each: no agent has died yet
    runner = model._runners["agent"]
    assert isinstance(runner, RecurrentGroupRunner)
    assert all(runner.hidden_states[agent].any() for agent in ("agent_0", "agent_1"))
    model.learn(2, reset_num_timesteps=False)  # step 2: agent_0 terminates in both copies
    assert not runner.hidden_states["agent_0"].any()
    assert runner.hidden_states["agent_1"].abs().sum(dim=(1, 2, 3)).gt(0).all()
    assert not runner.hidden_states["agent_2"].any()  # not joined yet: never acted


def _batch(seed: int = 0) -> tuple[RecurrentActorCriticPolicy, SequenceBatch]:
    """agent_2's recurrent policy and a batch of three sequences of lengths 2, 5 and 1 (the last cut by rollout_len,
    with a carried state)."""
    model = recurrent_model(DyingAgentsEnv(), rollout_len=5, learning_rate=frozen, n_episodes=3, seed=seed)
    drained = record_by_agent(model)
    model.learn(40)
    policy = model.policies["agent_2"]
    trajectories = [drained["agent_0"][0], *drained["agent_2"][:2]]
    assert [len(t) for t in trajectories] == [2, 5, 1]
    assert trajectories[2].initial_state.any()  # type: ignore[union-attr]
    return policy, build_sequence_batch(policy, trajectories, settings(), None, None)  # type: ignore[arg-type]


def test_padded_steps_never_reach_the_loss() -> None:
    policy, batch = _batch()
    together = batch.evaluate(policy, [0, 1, 2])  # padded to 5 steps: 3 + 0 + 4 padded rows
    alone = [batch.evaluate(policy, [i]) for i in range(3)]  # no padding
    assert len(together[1]) == len(batch) == sum(len(batch.rows([i])) for i in range(3))
    for output in (1, 2, 3):
        expected = th.cat([result[output] for result in alone])  # type: ignore[misc]
        th.testing.assert_close(together[output], expected)


def test_minibatches_are_sets_of_whole_sequences() -> None:
    lengths = np.array([2, 5, 1, 3])
    assert sequence_minibatches(lengths, 4, [0, 1, 2, 3]) == [[0, 1], [2, 3]]
    assert sequence_minibatches(lengths, None, [3, 1, 0, 2]) == [[3, 1, 0, 2]]
    assert sequence_minibatches(lengths, 1, [1, 0]) == [[1], [0]]


def test_batched_takes_the_reference_path_without_a_warning_and_equals_it() -> None:
    env_kwargs: dict[str, Any] = dict(n_episodes=2, batch_size=4, shuffle_minibatches=True)
    reference = recurrent_model(batched=False, **env_kwargs).learn(150)  # each model seeds torch's RNG: one at a time
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # batched=True is the default: a default setting does not warn
        batched = recurrent_model(batched=True, **env_kwargs)
    batched.learn(150)
    assert reference.policy_version == batched.policy_version > 1
    assert_same_parameters(parameters(reference), parameters(batched))


def test_share_parameters_trains_one_recurrent_policy_with_each_agent_its_own_state() -> None:
    model = recurrent_model(share_parameters=True)
    policies = list(model.policies.values())
    assert all(policy is policies[0] for policy in policies)
    model.learn(120)
    assert model.policy_version > 0
    runner = model._runners["agent"]
    assert isinstance(runner, RecurrentGroupRunner)
    assert set(runner.hidden_states) == set(model.possible_agents)


def test_predict_follows_the_recurrent_convention_per_agent() -> None:
    model = recurrent_model()
    model.learn(60)
    rng = np.random.default_rng(0)
    observations = [{agent: rng.random((3, 2), dtype=np.float32) for agent in model.possible_agents} for _ in range(4)]
    actions, states = model.predict(observations[0], episode_start=np.ones(3, dtype=bool), deterministic=True)
    assert states is not None and set(states) == set(model.possible_agents)
    assert all(state[0].shape == (1, 3, 8) and len(state) == 2 for state in states.values())
    for obs in observations[1:]:
        actions, states = model.predict(obs, state=states, episode_start=np.zeros(3, dtype=bool), deterministic=True)
    # The same as each agent's own policy stepped with its own state, as RecurrentPPO.predict does.
    for agent in model.possible_agents:
        state = None
        for t, obs in enumerate(observations):
            expected, state = model.policies[agent].predict(
                obs[agent], state, np.full(3, t == 0), deterministic=True
            )
        np.testing.assert_array_equal(actions[agent], expected)
        np.testing.assert_array_equal(states[agent][0], state[0])  # type: ignore[index]
    with pytest.raises(ValueError, match=r"takes state=\{agent_id: \(hidden, cell\)\}"):
        model.predict(observations[0], state=states["agent_0"])  # type: ignore[arg-type]


def test_predict_of_a_feed_forward_model_still_returns_no_state() -> None:
    model = IPPO("MlpPolicy", DyingAgentsEnv(), policy_kwargs=dict(net_arch=[8]))
    assert model.predict({"agent_0": np.zeros(2, np.float32)})[1] is None


@pytest.mark.parametrize("suffix", [".zip", ".safetensors"])
def test_save_and_load_keep_the_recurrent_policies(tmp_path: Any, suffix: str) -> None:
    model = recurrent_model()
    model.learn(100)
    model.save(tmp_path / f"model{suffix}")
    loaded = IPPO.load(tmp_path / f"model{suffix}", env=DyingAgentsEnv())
    assert all(isinstance(policy, RecurrentActorCriticPolicy) for policy in loaded.policies.values())
    assert_same_parameters(parameters(model), parameters(loaded))
    obs = {agent: np.full((2, 2), 0.5, np.float32) for agent in model.possible_agents}
    first = second = None
    for _ in range(3):
        a1, first = model.predict(obs, first, deterministic=True)
        a2, second = loaded.predict(obs, second, deterministic=True)
        assert all(np.array_equal(a1[agent], a2[agent]) for agent in a1)
    loaded.learn(60)


@pytest.mark.parametrize("normalize_obs", [False, True])
def test_export_round_trips_through_recurrent_ppo_load(tmp_path: Any, normalize_obs: bool) -> None:
    model = recurrent_model(normalize_obs=normalize_obs)
    model.learn(150)
    model.export_agent("agent_1", tmp_path / "agent_1.zip")
    exported = RecurrentPPO.load(tmp_path / "agent_1.zip")
    assert isinstance(exported.policy, RecurrentActorCriticPolicy)
    rng = np.random.default_rng(1)
    ours = theirs = None
    starts = np.array([True, True, True])
    for t in range(6):
        obs = rng.random((3, 2), dtype=np.float32)
        actions, ours = model.predict({"agent_1": obs}, ours, episode_start=starts, deterministic=True)
        expected, theirs = exported.predict(obs, theirs, episode_start=starts, deterministic=True)
        np.testing.assert_array_equal(actions["agent_1"], expected)
        np.testing.assert_allclose(ours["agent_1"][0], theirs[0], atol=1e-5)  # type: ignore[index]
        starts = np.array([False, t == 2, False])


def test_evaluate_policy_and_the_eval_callback_carry_each_agents_state_through_the_episode() -> None:
    model = recurrent_model()
    model.learn(100)
    returns, _ = evaluate_policy(model, DyingAgentsEnv(), n_eval_episodes=2, return_episode_rewards=True)
    # By hand: each agent's state carried from step to step, reset at the episode start.
    env = DyingAgentsEnv()
    expected = []
    for _ in range(2):
        obs, _ = env.reset()
        states, start, total = None, True, 0.0
        while env.agents:
            batch = {agent: obs[agent][None] for agent in env.agents}
            actions, states = model.predict(batch, states, np.array([start]), deterministic=True)
            obs, rewards, _, _, _ = env.step({agent: int(action[0]) for agent, action in actions.items()})
            total, start = total + sum(rewards.values()), False
        expected.append(total)
    assert list(returns) == expected  # type: ignore[arg-type]
    callback = MultiAgentEvalCallback(DyingAgentsEnv(), n_eval_episodes=2, eval_freq=6, verbose=0)
    model.learn(6, callback=callback, reset_num_timesteps=False)
    assert callback.last_mean_reward == pytest.approx(np.mean(expected))


def test_episode_start_may_be_given_per_agent() -> None:
    model = recurrent_model()
    obs = {agent: np.full((2, 2), 0.5, np.float32) for agent in model.possible_agents}
    _, states = model.predict(obs)
    assert states is not None
    starts = {agent: np.array([agent == "agent_0", False]) for agent in model.possible_agents}
    _, after = model.predict(obs, states, starts)
    _, fresh = model.predict(obs)
    assert after is not None and fresh is not None
    np.testing.assert_array_equal(after["agent_0"][0][:, 0], fresh["agent_0"][0][:, 0])  # reset: as from zeros
    assert not np.array_equal(after["agent_1"][0][:, 0], fresh["agent_1"][0][:, 0])  # carried


@pytest.mark.slow
def test_the_learner_process_trains_recurrent_policies() -> None:
    env = make_vec_env(DyingAgentsEnv, n_envs=2, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback
        model = recurrent_model(env, async_training=True)
    model.learn(200)
    assert model.policy_version > 1


# The memory task: 2 agents, the cue at the first step, the answer due 4 steps later. Best team return 2, chance 1.
MEMORY_BUDGET = 3_000  # env steps: MlpLstmPolicy solves it in about 1,500 here (14 s on a loaded 2-core machine)


def memory_task_return(policy: str, timesteps: int = MEMORY_BUDGET) -> float:
    """The mean team return over 200 evaluation episodes of CueMemoryEnv after ``timesteps`` of training."""
    env = make_vec_env(lambda: CueMemoryEnv(n_agents=2, delay=4), n_envs=4, seed=0)
    policy_kwargs: dict[str, Any] = dict(net_arch=[16])
    if "Lstm" in policy:
        policy_kwargs["lstm_hidden_size"] = 16
    model = IPPO(
        policy,
        env,
        n_episodes=16,
        n_epochs=10,
        learning_rate=3e-3,
        ent_coef=0.01,
        policy_kwargs=policy_kwargs,
        seed=0,
        async_training=False,
        batched=False,
    )
    model.learn(timesteps)
    mean, _ = evaluate_policy(model, CueMemoryEnv(n_agents=2, delay=4), n_eval_episodes=200)
    return mean


def test_a_recurrent_policy_solves_the_memory_task() -> None:
    assert memory_task_return("MlpLstmPolicy") >= 0.95 * 2.0


@pytest.mark.slow
def test_a_feed_forward_policy_stays_at_chance_on_the_memory_task_with_the_same_budget() -> None:
    # Chance is 1.0 (each agent guesses its cue); 200 episodes put the mean within about 0.1 of it.
    assert abs(memory_task_return("MlpPolicy") - 1.0) <= 0.15
