"""The multi-agent vectorized env: ``make_vec_env`` and the arrays it hands out, on real and on test envs."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from mpe2 import simple_adversary_v3, simple_spread_v3
from pettingzoo.butterfly import knights_archers_zombies_v11
from pettingzoo.classic import tictactoe_v3
from pettingzoo.sisl import pursuit_v5
from pettingzoo.test import parallel_api_test

from sb3_ippo import make_vec_env
from sb3_ippo.vec_env.subproc import SubprocMultiAgentVecEnv
from sb3_ippo.vec_env import MultiAgentStep
from tests.envs import (
    HETEROGENEOUS_AGENTS,
    CartPoleParallelEnv,
    CrashingEnv,
    CueMemoryEnv,
    DyingAgentsEnv,
    FactoryThatFailsInWorkers,
    HeterogeneousEnv,
    NoRenderModeEnv,
    RevivingEnv,
    VariableLengthEnv,
)
from tests.helpers import (
    SAME_DATA_ENVS,
    action_sampler,
    assert_env_method_calls_the_chosen_copies,
    assert_get_attr_reads_each_copys_attribute,
    assert_max_episode_steps_truncates_every_episode,
    assert_same,
    assert_set_attr_changes_only_the_chosen_copies,
    closing,
    oracle_actions,
    rollout,
)

VEC_ENV_CLASSES = ["dummy", "subproc"]


# --- Real PettingZoo envs ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("continuous_actions", [False, True])
def test_simple_spread_data_is_the_raw_envs_data(continuous_actions: bool) -> None:
    """Copy i behaves as a raw env reset with seed + i, then reset without a seed at each episode end."""
    env_kwargs = {"N": 3, "max_cycles": 3, "continuous_actions": continuous_actions}
    n_envs, seed = 2, 7
    with closing(make_vec_env(simple_spread_v3.parallel_env, n_envs=n_envs, seed=seed, env_kwargs=env_kwargs)) as vec_env:
        sample = action_sampler(vec_env)
        raw_envs = [simple_spread_v3.parallel_env(**env_kwargs) for _ in range(n_envs)]
        raw_obs = [env.reset(seed=seed + i)[0] for i, env in enumerate(raw_envs)]
        obs = vec_env.reset()
        for _ in range(7):
            for i in range(n_envs):
                for agent in vec_env.possible_agents:
                    np.testing.assert_array_equal(obs[agent][i], raw_obs[i][agent])
            actions = sample()
            step = vec_env.step_agents(actions)
            for i, env in enumerate(raw_envs):
                raw_obs[i], rewards, _, truncations, _ = env.step({agent: actions[agent][i] for agent in env.agents})
                assert step.dones[i] == (not env.agents)
                for agent in vec_env.possible_agents:
                    assert step.rewards[agent][i] == np.float32(rewards[agent])
                    assert step.truncations[agent][i] == truncations[agent]
                if not env.agents:
                    for agent in vec_env.possible_agents:
                        np.testing.assert_array_equal(step.final_obs[agent][i], raw_obs[i][agent])
                    raw_obs[i] = env.reset()[0]
            obs = step.obs


def test_simple_adversary_agents_keep_their_own_observation_shapes() -> None:
    with closing(make_vec_env(simple_adversary_v3.parallel_env, n_envs=3, seed=0, env_kwargs={"max_cycles": 3})) as vec_env:
        obs = vec_env.reset()
        step = vec_env.step_agents(action_sampler(vec_env)())
        for observations in (obs, step.obs):
            assert observations["adversary_0"].shape == (3, 8)
            assert observations["agent_0"].shape == observations["agent_1"].shape == (3, 10)


def test_knights_archers_zombies_agents_that_die_stay_masked_until_the_episode_ends() -> None:
    # With line_death, an agent that walks into the top wall dies: archer_0 turns and dies within a few steps,
    # knight_0 walks up and dies later, the other two stand still until the time limit.
    scripted = {"archer_0": 1, "knight_0": 0, "archer_1": 5, "knight_1": 5}
    n_envs = 2
    env_kwargs = {"max_cycles": 30, "line_death": True}
    vec_env = make_vec_env(knights_archers_zombies_v11.parallel_env, n_envs=n_envs, seed=0, env_kwargs=env_kwargs)
    with closing(vec_env):
        vec_env.reset()
        actions = {agent: np.full(n_envs, action) for agent, action in scripted.items()}
        left: set[tuple[str, int]] = set()
        for _ in range(30):
            step = vec_env.step_agents(actions)
            if step.dones.all():
                break
            for agent in vec_env.possible_agents:
                for i in range(n_envs):
                    if (agent, i) in left:
                        assert not step.alive[agent][i] and step.rewards[agent][i] == 0, f"{agent} revived in copy {i}"
                    elif not step.alive[agent][i]:
                        assert step.terminations[agent][i] and i in step.final_obs[agent]
                        left.add((agent, i))
        assert step.dones.all() and ("archer_0", 0) in left and ("knight_0", 0) in left
        assert all(step.alive[agent].all() for agent in vec_env.possible_agents), "a new episode starts with every agent"


def test_pursuit_image_observations_are_batched_and_handed_over_at_truncation() -> None:
    with closing(make_vec_env(pursuit_v5.parallel_env, n_envs=2, seed=0, env_kwargs={"max_cycles": 2})) as vec_env:
        obs = vec_env.reset()
        assert obs["pursuer_0"].shape == (2, 7, 7, 3) and obs["pursuer_0"].dtype == np.float32
        sample = action_sampler(vec_env)
        vec_env.step_agents(sample())
        step = vec_env.step_agents(sample())
        assert step.dones.all()
        assert all(step.truncations[agent].all() for agent in vec_env.possible_agents)
        assert all(step.final_obs[agent][i].shape == (7, 7, 3) for agent in vec_env.possible_agents for i in range(2))


# --- Shapes, spaces and actions ------------------------------------------------------------------------------------


@pytest.mark.parametrize("agent", HETEROGENEOUS_AGENTS)
def test_observations_have_one_row_per_copy(agent: str) -> None:
    with closing(make_vec_env(HeterogeneousEnv, n_envs=3, seed=0)) as vec_env:
        space = vec_env.observation_spaces[agent]
        reset_obs = vec_env.reset()
        step = vec_env.step_agents(action_sampler(vec_env)())
        for obs in (reset_obs[agent], step.obs[agent]):
            if isinstance(space, gym.spaces.Dict):
                assert set(obs) == set(space.spaces)
                for key, subspace in space.spaces.items():
                    assert obs[key].shape == (3, *subspace.shape) and obs[key].dtype == subspace.dtype
            else:
                assert obs.shape == (3, *space.shape) and obs.dtype == space.dtype
        for per_agent in (step.rewards, step.terminations, step.truncations, step.alive):
            assert per_agent[agent].shape == (3,)


def test_image_observations_keep_uint8_pixels() -> None:
    with closing(make_vec_env(HeterogeneousEnv, n_envs=2, seed=0, env_kwargs={"agents": ["image"]})) as vec_env:
        images = vec_env.reset()["image"]
        assert images.shape == (2, 36, 36, 3) and images.dtype == np.uint8
        assert set(np.unique(images)) <= {0, 255}


def test_each_copy_receives_its_row_of_every_action_space_type() -> None:
    with closing(make_vec_env(HeterogeneousEnv, n_envs=3, seed=0)) as vec_env:
        vec_env.reset()
        actions = action_sampler(vec_env)()
        vec_env.step_agents(actions)  # the env refuses actions of the wrong shape
        for i, received in enumerate(vec_env.get_attr("last_actions")):
            assert set(received) == set(HETEROGENEOUS_AGENTS)
            for agent in HETEROGENEOUS_AGENTS:
                np.testing.assert_array_equal(received[agent], actions[agent][i])


def test_num_envs_agents_and_spaces_describe_the_env() -> None:
    with closing(make_vec_env(HeterogeneousEnv, n_envs=3)) as vec_env:
        env = HeterogeneousEnv()
        assert vec_env.num_envs == 3
        assert vec_env.possible_agents == env.possible_agents
        for agent in env.possible_agents:
            assert vec_env.observation_spaces[agent] == env.observation_space(agent)
            assert vec_env.action_spaces[agent] == env.action_space(agent)


def test_actions_for_an_unknown_agent_are_refused() -> None:
    with closing(make_vec_env(DyingAgentsEnv, n_envs=2)) as vec_env:
        vec_env.reset()
        with pytest.raises(KeyError, match="unknown agents"):
            vec_env.step_agents({"nobody": np.zeros(2)})


def test_actions_need_one_row_per_copy() -> None:
    with closing(make_vec_env(DyingAgentsEnv, n_envs=2)) as vec_env:
        vec_env.reset()
        with pytest.raises(ValueError, match="one per env copy"):
            vec_env.step_agents({agent: np.zeros(3, dtype=np.int64) for agent in vec_env.possible_agents})


# --- Agents that leave, join or come back ---------------------------------------------------------------------------


def test_alive_mask_drops_agents_that_leave_until_the_next_episode() -> None:
    # DyingAgentsEnv: agent_0 dies after step 2, agent_1 after step 4, agent_2 is truncated after step 6.
    with closing(make_vec_env(DyingAgentsEnv, n_envs=2)) as vec_env:
        obs = vec_env.reset()
        masks = [[vec_env.alive[agent].tolist() for agent in vec_env.possible_agents]]
        for _ in range(7):
            step = vec_env.step_agents(oracle_actions(obs))
            obs = step.obs
            masks.append([step.alive[agent].tolist() for agent in vec_env.possible_agents])
        T, F = [True, True], [False, False]  # the same in both copies
        assert masks == [[T, T, T], [T, T, T], [F, T, T], [F, T, T], [F, F, T], [F, F, T], [T, T, T], [T, T, T]]


def test_agents_that_left_get_no_actions() -> None:
    with closing(make_vec_env(DyingAgentsEnv, n_envs=2)) as vec_env:
        vec_env.reset()
        every_agent_acts = {agent: np.zeros(2, dtype=np.int64) for agent in vec_env.possible_agents}
        for _ in range(3):
            vec_env.step_agents(every_agent_acts)  # the env raises if an agent that left is given an action
        assert [set(actions) for actions in vec_env.get_attr("last_actions")] == [{"agent_1", "agent_2"}] * 2


def test_agents_that_left_produce_no_transitions() -> None:
    with closing(make_vec_env(DyingAgentsEnv, n_envs=2)) as vec_env:
        obs = vec_env.reset()
        for _ in range(3):
            step = vec_env.step_agents(oracle_actions(obs))
            obs = step.obs
        assert not step.alive["agent_0"].any()
        assert (step.rewards["agent_0"] == 0).all() and not step.terminations["agent_0"].any()
        assert not step.truncations["agent_0"].any() and step.final_obs["agent_0"] == {}


def test_agents_are_not_revived_within_an_episode() -> None:
    with closing(make_vec_env(RevivingEnv, n_envs=2)) as vec_env:
        # agent_0 dies after step 2; the env brings it back after step 3.
        obs = vec_env.reset()
        alive_agent_0, rewards_agent_0 = [], []
        for _ in range(5):
            step = vec_env.step_agents(oracle_actions(obs))
            obs = step.obs
            alive_agent_0.append(bool(step.alive["agent_0"].any()))
            rewards_agent_0.append(step.rewards["agent_0"].sum())
        assert all("agent_0" in agents for agents in vec_env.get_attr("agents")), "the env did revive agent_0"
        assert alive_agent_0 == [True, False, False, False, False]
        assert rewards_agent_0 == [2, 2, 0, 0, 0]
        assert vec_env.step_agents(oracle_actions(obs)).alive["agent_0"].all(), "the next episode has agent_0 again"


def test_agent_absent_at_reset_is_masked_until_it_joins() -> None:
    env_kwargs = {"death_steps": {"agent_0": None, "late": None}, "join_steps": {"late": 2}, "max_steps": 4}
    with closing(make_vec_env(DyingAgentsEnv, n_envs=2, env_kwargs=env_kwargs)) as vec_env:
        obs = vec_env.reset()
        assert not vec_env.alive["late"].any()
        step = vec_env.step_agents(oracle_actions(obs))  # the env raises if "late" is given an action before it joins
        assert not step.alive["late"].any() and (step.rewards["late"] == 0).all()
        step = vec_env.step_agents(oracle_actions(step.obs))
        assert step.alive["late"].all()
        np.testing.assert_array_equal(step.obs["late"], [[2 / 4, 1], [2 / 4, 1]])
        vec_env.step_agents(oracle_actions(step.obs))
        assert [set(actions) for actions in vec_env.get_attr("last_actions")] == [{"agent_0", "late"}] * 2


# --- Episode ends, automatic resets and statistics -----------------------------------------------------------------


def test_copies_end_their_episodes_at_their_own_steps() -> None:
    with closing(make_vec_env(VariableLengthEnv, n_envs=3, seed=5)) as vec_env:
        obs = vec_env.reset()
        lengths = vec_env.get_attr("episode_length")
        assert len(set(lengths)) == 3, "precondition: seeds 5, 6, 7 draw different lengths"
        first_end = [0] * 3
        for t in range(1, max(lengths) + 1):
            step = vec_env.step_agents(oracle_actions(obs))
            obs = step.obs
            for i in np.flatnonzero(step.dones):
                if not first_end[i]:
                    first_end[i] = t
                    assert step.infos[i]["episode"]["l"] == t
        assert first_end == lengths


def test_final_observation_is_handed_over_at_truncation() -> None:
    env_kwargs = {"death_steps": {"agent_0": None, "agent_1": None}, "max_steps": 3}
    with closing(make_vec_env(DyingAgentsEnv, n_envs=2, env_kwargs=env_kwargs)) as vec_env:
        obs = vec_env.reset()
        for _ in range(3):
            step = vec_env.step_agents(oracle_actions(obs))
            obs = step.obs
        assert step.dones.all() and step.truncations["agent_0"].all() and not step.terminations["agent_0"].any()
        # The episode ended on observation [t=3/3, target=(3 + 0) % 2]; the copy then reset to [0, 0].
        assert [step.final_obs["agent_0"][i].tolist() for i in range(2)] == [[1.0, 1.0]] * 2
        assert step.obs["agent_0"].tolist() == [[0.0, 0.0]] * 2


def test_final_observation_is_handed_over_when_an_agent_terminates() -> None:
    with closing(make_vec_env(DyingAgentsEnv, n_envs=2)) as vec_env:
        obs = vec_env.step_agents(oracle_actions(vec_env.reset())).obs
        step = vec_env.step_agents(oracle_actions(obs))
        assert step.terminations["agent_0"].all() and not step.dones.any()
        for i in range(2):
            np.testing.assert_array_equal(step.final_obs["agent_0"][i], np.array([2 / 6, 0.0], dtype=np.float32))
        assert step.final_obs["agent_1"] == {} and step.final_obs["agent_2"] == {}


def test_episode_statistics_give_team_return_agent_returns_and_length() -> None:
    # Right actions pay 1 per step: agent_0 acts for 2 steps, agent_1 for 4, agent_2 for 6.
    with closing(make_vec_env(DyingAgentsEnv, n_envs=2)) as vec_env:
        obs = vec_env.reset()
        for _ in range(5):
            step = vec_env.step_agents(oracle_actions(obs))
            obs = step.obs
            assert not any("episode" in info for info in step.infos)
        step = vec_env.step_agents(oracle_actions(obs))
        assert step.dones.all()
        for info in step.infos:
            episode = info["episode"]
            assert episode["r"] == 12.0 and episode["l"] == 6 and episode["t"] >= 0
            assert episode["agent_returns"] == {"agent_0": 2.0, "agent_1": 4.0, "agent_2": 6.0}


def test_max_episode_steps_must_be_positive() -> None:
    with closing(make_vec_env(DyingAgentsEnv)) as vec_env, pytest.raises(ValueError, match="max_episode_steps"):
        vec_env.max_episode_steps = 0


@pytest.mark.parametrize("vec_env_cls", VEC_ENV_CLASSES)
def test_max_episode_steps_truncates_every_episode(vec_env_cls: str) -> None:
    assert_max_episode_steps_truncates_every_episode(vec_env_cls)


# --- Seeding --------------------------------------------------------------------------------------------------------


def test_copy_i_is_seeded_with_seed_plus_i() -> None:
    with closing(make_vec_env(HeterogeneousEnv, n_envs=3, seed=10)) as vec_env:
        obs = vec_env.reset()
        for i in range(3):
            expected, _ = HeterogeneousEnv().reset(seed=10 + i)
            assert_same({agent: _row(obs[agent], i) for agent in obs}, expected)


def _row(obs: Any, i: int) -> Any:
    return {key: value[i] for key, value in obs.items()} if isinstance(obs, dict) else obs[i]


def test_same_seed_gives_same_data() -> None:
    with (
        closing(make_vec_env(VariableLengthEnv, n_envs=3, seed=5)) as first,
        closing(make_vec_env(VariableLengthEnv, n_envs=3, seed=5)) as second,
    ):
        assert_same(rollout(first, 12), rollout(second, 12))


def test_different_seeds_give_different_data() -> None:
    with (
        closing(make_vec_env(HeterogeneousEnv, n_envs=2, seed=5)) as first,
        closing(make_vec_env(HeterogeneousEnv, n_envs=2, seed=6)) as second,
    ):
        assert not np.array_equal(first.reset()["discrete"], second.reset()["discrete"])


@pytest.mark.parametrize("env_name", SAME_DATA_ENVS)
def test_dummy_and_subproc_give_identical_data(env_name: str) -> None:
    env_fn, env_kwargs = SAME_DATA_ENVS[env_name]
    data = {}
    for vec_env_cls in VEC_ENV_CLASSES:
        with closing(make_vec_env(env_fn, n_envs=3, seed=1, vec_env_cls=vec_env_cls, env_kwargs=env_kwargs)) as vec_env:
            data[vec_env_cls] = rollout(vec_env, 10)
    assert_same(data["subproc"], data["dummy"])


# --- What make_vec_env accepts --------------------------------------------------------------------------------------


def test_aec_env_is_converted_to_parallel() -> None:
    env_kwargs = {"N": 3, "max_cycles": 3}
    with (
        closing(make_vec_env(simple_spread_v3.env, n_envs=2, seed=0, env_kwargs=env_kwargs)) as aec,
        closing(make_vec_env(simple_spread_v3.parallel_env, n_envs=2, seed=0, env_kwargs=env_kwargs)) as parallel,
    ):
        assert_same(rollout(aec, 5), rollout(parallel, 5))


def test_aec_env_that_cannot_run_in_parallel_is_stepped_turn_by_turn_in_this_process() -> None:
    # The turn-based copies themselves: tests/test_games.py.
    assert type(make_vec_env(tictactoe_v3.env, n_envs=2)).__name__ == "TurnBasedMultiAgentVecEnv"
    with pytest.raises(ValueError, match=r"turn-based .* in this process"):
        make_vec_env(tictactoe_v3.env, n_envs=2, vec_env_cls="subproc")


@pytest.mark.parametrize(
    "env_fn",
    [lambda: gym.make("CartPole-v1"), "simple_spread_v3", lambda: "simple_spread_v3"],
    ids=["gymnasium_env", "string", "factory_of_a_string"],
)
def test_what_is_not_a_pettingzoo_env_is_refused(env_fn: Any) -> None:
    with pytest.raises(TypeError, match="PettingZoo"):
        make_vec_env(env_fn)


def test_unknown_vec_env_class_is_refused() -> None:
    with pytest.raises(ValueError, match="'dummy', 'subproc' or 'ray'"):
        make_vec_env(DyingAgentsEnv, vec_env_cls="threads")


# --- get_attr, set_attr, env_method ---------------------------------------------------------------------------------


@pytest.mark.parametrize("vec_env_cls", VEC_ENV_CLASSES)
def test_get_attr_reads_each_copys_attribute(vec_env_cls: str) -> None:
    assert_get_attr_reads_each_copys_attribute(vec_env_cls)


@pytest.mark.parametrize("vec_env_cls", VEC_ENV_CLASSES)
def test_a_missing_attribute_is_an_attribute_error_and_the_copies_go_on(vec_env_cls: str) -> None:
    # SB3's VecEnv reads render_mode with get_attr and takes an AttributeError as "None" (with a warning).
    with pytest.warns(UserWarning, match="render_mode"):
        vec_env = make_vec_env(NoRenderModeEnv, n_envs=3, vec_env_cls=vec_env_cls)
    with closing(vec_env):
        assert vec_env.render_mode is None
        with pytest.raises(AttributeError, match="no_such_attribute"):
            vec_env.get_attr("no_such_attribute")
        obs = vec_env.reset()
        assert vec_env.step_agents(oracle_actions(obs)).rewards["agent_0"].tolist() == [1.0, 1.0, 1.0]


@pytest.mark.parametrize("vec_env_cls", VEC_ENV_CLASSES)
def test_set_attr_changes_only_the_chosen_copies(vec_env_cls: str) -> None:
    assert_set_attr_changes_only_the_chosen_copies(vec_env_cls)


@pytest.mark.parametrize("vec_env_cls", VEC_ENV_CLASSES)
def test_env_method_calls_the_chosen_copies(vec_env_cls: str) -> None:
    assert_env_method_calls_the_chosen_copies(vec_env_cls)


# --- Worker processes -----------------------------------------------------------------------------------------------


def test_close_shuts_the_workers_down_cleanly() -> None:
    vec_env = make_vec_env(DyingAgentsEnv, n_envs=3, vec_env_cls="subproc")
    assert isinstance(vec_env, SubprocMultiAgentVecEnv)
    vec_env.reset()
    vec_env.close()
    assert [process.exitcode for process in vec_env.processes] == [0] * len(vec_env.processes)
    vec_env.close()  # a second close is harmless
    with pytest.raises(RuntimeError, match="closed"):
        vec_env.step_agents({agent: np.zeros(3, dtype=np.int64) for agent in vec_env.possible_agents})


@pytest.mark.usefixtures("no_hang")
@pytest.mark.parametrize(
    ("how", "message"), [("raise", "crashed on purpose at step 2"), ("exit", "exit code 3")], ids=["raises", "exits"]
)
def test_crashing_worker_raises_in_the_parent(how: str, message: str) -> None:
    vec_env = make_vec_env(CrashingEnv, n_envs=2, vec_env_cls="subproc", env_kwargs={"how": how})
    assert isinstance(vec_env, SubprocMultiAgentVecEnv)
    vec_env.reset()
    actions = {agent: np.zeros(2, dtype=np.int64) for agent in vec_env.possible_agents}
    vec_env.step_agents(actions)
    with pytest.raises(RuntimeError, match=message):
        vec_env.step_agents(actions)
    assert vec_env.closed and not any(process.is_alive() for process in vec_env.processes)


@pytest.mark.usefixtures("no_hang")
def test_worker_that_dies_while_starting_raises_in_the_parent() -> None:
    with pytest.raises(RuntimeError, match=r"worker 0 .*exit code 1"):
        make_vec_env(FactoryThatFailsInWorkers(), n_envs=2, vec_env_cls="subproc")


# --- The test envs are well-formed PettingZoo envs ------------------------------------------------------------------


@pytest.mark.parametrize(
    "make_env",
    [
        DyingAgentsEnv,
        lambda: DyingAgentsEnv(join_steps={"agent_2": 2}),
        HeterogeneousEnv,
        VariableLengthEnv,
        CartPoleParallelEnv,
        CueMemoryEnv,
    ],
    ids=["dying", "joining", "heterogeneous", "variable_length", "cartpole", "cue_memory"],
)
def test_test_envs_pass_the_pettingzoo_parallel_api_test(make_env: Callable[[], Any]) -> None:
    parallel_api_test(make_env(), num_cycles=600)


def test_cartpole_parallel_env_is_gymnasium_cartpole() -> None:
    env, cartpole = CartPoleParallelEnv(), gym.make("CartPole-v1")
    obs, _ = env.reset(seed=3)
    expected, _ = cartpole.reset(seed=3)
    np.testing.assert_array_equal(obs["cartpole"], expected)
    for _ in range(200):
        obs, rewards, terminations, truncations, _ = env.step({"cartpole": 1})
        expected, reward, terminated, truncated, _ = cartpole.step(1)
        np.testing.assert_array_equal(obs["cartpole"], expected)
        assert (rewards["cartpole"], terminations["cartpole"], truncations["cartpole"]) == (reward, terminated, truncated)
        if terminated or truncated:
            break
    assert env.agents == [], "the agent leaves when CartPole's episode ends"


def test_vectorized_step_returns_a_multi_agent_step() -> None:
    with closing(make_vec_env(CartPoleParallelEnv, n_envs=2, seed=0)) as vec_env:
        vec_env.reset()
        step = vec_env.step_agents({"cartpole": np.array([0, 1])})
        assert isinstance(step, MultiAgentStep) and step.obs["cartpole"].shape == (2, 4)


def test_step_follows_sb3_vec_env_contract_with_team_rewards() -> None:
    """``step`` returns SB3's (obs, rewards, dones, infos), the rewards being each copy's sum over agents."""
    twin = make_vec_env(simple_spread_v3.parallel_env, n_envs=2, seed=3, env_kwargs=dict(max_cycles=4))
    vec_env = make_vec_env(simple_spread_v3.parallel_env, n_envs=2, seed=3, env_kwargs=dict(max_cycles=4))
    twin.reset()
    vec_env.reset()
    sample = action_sampler(vec_env)
    for _ in range(4):
        actions = sample()
        detail = twin.step_agents(actions)
        obs, rewards, dones, infos = vec_env.step(actions)
        np.testing.assert_allclose(rewards, sum(detail.rewards.values()), rtol=1e-6)
        np.testing.assert_array_equal(dones, detail.dones)
        for agent in vec_env.possible_agents:
            np.testing.assert_array_equal(obs[agent], detail.obs[agent])
    assert dones.all() and all("episode" in info for info in infos), "max_cycles=4 ends every copy at step 4"
    twin.close()
    vec_env.close()
