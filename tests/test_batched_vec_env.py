"""Natively batched envs (``sb3_ippo.vec_env.batched``): one env object stepping every copy at once behaves as the same
env's PettingZoo copies do, and IPPO trains, saves, loads and evaluates on it. The game is ``tests.batched_envs``'s chase,
written twice (torch-batched and PettingZoo), with agents that leave the episode at different steps. VMAS, where it
installs (``pip install -e ".[vmas]"``), through its adapter."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch as th

from sb3_ippo import IPPO, MAPPO, MultiAgentEvalCallback, evaluate_policy, make_vec_env
from sb3_ippo.vec_env import BatchedMultiAgentVecEnv, BatchedParallelEnv
from tests.batched_envs import ChaseParallelEnv, TorchChaseEnv
from tests.helpers import assert_same, assert_same_parameters, parameters, rollout

N_ENVS = 8


def without_agent_infos(data: list[Any]) -> list[Any]:
    """The rollout's data without the env's own per-agent infos (a batched env's infos are not split per copy)."""
    return [
        step._replace(infos=[{k: v for k, v in info.items() if k != "agents"} for info in step.infos])
        if hasattr(step, "infos")
        else step
        for step in data
    ]


def batched(n_envs: int = N_ENVS, seed: int | None = 3, **kwargs: Any) -> BatchedMultiAgentVecEnv:
    vec_env = make_vec_env(TorchChaseEnv, n_envs, seed=seed, vec_env_cls="batched", env_kwargs=kwargs)
    assert isinstance(vec_env, BatchedMultiAgentVecEnv)
    return vec_env


def pettingzoo_copies(n_envs: int = N_ENVS, seed: int | None = 3, **kwargs: Any) -> Any:
    return make_vec_env(ChaseParallelEnv, n_envs, seed=seed, env_kwargs=kwargs)


def small_model(env: Any, **kwargs: Any) -> IPPO:
    return IPPO("MlpPolicy", env, seed=0, n_steps=128, n_epochs=2, policy_kwargs=dict(net_arch=[16]), **kwargs)


def test_the_test_env_satisfies_the_protocol() -> None:
    assert isinstance(TorchChaseEnv(2), BatchedParallelEnv)


@pytest.mark.parametrize("max_episode_steps", [None, 5])
def test_batched_copies_step_as_pettingzoo_copies(max_episode_steps: int | None) -> None:
    """Same seed, same actions: the same observations, rewards, flags, alive masks, final observations, resets and
    per-copy episode returns and lengths, step for step (agents die at different steps in different copies)."""
    first, second = batched(), pettingzoo_copies()
    first.max_episode_steps = second.max_episode_steps = max_episode_steps
    expected = without_agent_infos(rollout(second, 300))
    actual = without_agent_infos(rollout(first, 300))
    assert_same(actual, expected)
    episodes = [info["episode"] for step in expected[1:] for info in step.infos if "episode" in info]
    assert len(episodes) > 50 and len({e["l"] for e in episodes}) > 2, "the rollout should hold episodes of many lengths"
    assert any(not step.alive[agent].all() for step in expected[1:] for agent in step.alive), "no agent ever left early"


def test_ippo_trains_on_the_batched_env_as_on_pettingzoo_copies() -> None:
    """A seeded run gives the same parameters whether the copies are batched or PettingZoo envs."""
    on_batched = small_model(batched(seed=None)).learn(2_000)
    on_copies = small_model(pettingzoo_copies(seed=None)).learn(2_000)
    assert on_batched.policy_version >= 3
    assert on_batched.num_timesteps == on_copies.num_timesteps
    assert_same_parameters(parameters(on_batched), parameters(on_copies))


def test_ippo_takes_the_batched_env_itself(tmp_path: Path) -> None:
    """``IPPO("MlpPolicy", env)`` on the raw batched env; learn, save, load, predict and evaluate as with any env."""
    model = IPPO("MlpPolicy", TorchChaseEnv(16), seed=0, policy_kwargs=dict(net_arch=[16]))
    assert isinstance(model.get_env(), BatchedMultiAgentVecEnv)
    model.learn(1_000)
    model.save(tmp_path / "chase.zip")
    loaded = IPPO.load(tmp_path / "chase.zip", env=TorchChaseEnv(16))
    obs = {agent: np.tile(np.float32([0.25, -0.5, 0.0]), (5, 1)) for agent in model.possible_agents}
    expected, _ = model.predict(obs, deterministic=True)
    actual, _ = loaded.predict(obs, deterministic=True)
    assert_same(actual, expected)
    evaluations = MultiAgentEvalCallback(TorchChaseEnv(4), eval_freq=20, n_eval_episodes=4, verbose=0)
    loaded.learn(500, reset_num_timesteps=False, callback=evaluations)
    assert loaded.num_timesteps > model.num_timesteps
    assert np.isfinite(evaluations.last_mean_reward)  # -inf until the first evaluation


def test_evaluate_policy_scores_batched_copies_as_pettingzoo_copies() -> None:
    model = small_model(pettingzoo_copies())
    on_batched = evaluate_policy(model, batched(seed=5), n_eval_episodes=16, return_episode_rewards=True)
    on_copies = evaluate_policy(model, pettingzoo_copies(seed=5), n_eval_episodes=16, return_episode_rewards=True)
    assert on_batched == on_copies


def test_ippo_learns_on_the_batched_env() -> None:
    """On 64 batched copies, a few updates raise the team return above the untrained policy's."""
    env = batched(64, seed=0)
    model = IPPO("MlpPolicy", env, seed=0, n_steps=2048, n_epochs=5, policy_kwargs=dict(net_arch=[32]))
    before, _ = evaluate_policy(model, batched(64, seed=100), n_eval_episodes=128)
    model.learn(30_000)
    after, _ = evaluate_policy(model, batched(64, seed=100), n_eval_episodes=128)
    assert after > before + 2.0, (before, after)  # seen: -3.0 before, 1.9 after


# --- Clear errors -----------------------------------------------------------------------------------------------------


class WithoutResetCopies:
    num_envs = 4
    possible_agents = ["agent_0"]  # noqa: RUF012

    def observation_space(self, agent: str) -> Any:
        return TorchChaseEnv(1).observation_space(agent)

    def action_space(self, agent: str) -> Any:
        return TorchChaseEnv(1).action_space(agent)

    def reset(self, seed: int | None = None) -> Any:
        return {"agent_0": np.zeros((4, 3), np.float32)}

    def step(self, actions: Any) -> Any:
        return self.reset(), {"agent_0": np.zeros(4)}, {"agent_0": np.zeros(4)}, {"agent_0": np.zeros(4)}, {}


def test_a_batched_env_missing_a_method_is_a_clear_error() -> None:
    with pytest.raises(TypeError, match=r"lacks reset_copies.*reset_copies\(mask\)"):
        IPPO("MlpPolicy", WithoutResetCopies())


class WrongRewardShape(TorchChaseEnv):
    def step(self, actions: dict[str, np.ndarray]) -> tuple[dict, dict, dict, dict, dict]:
        obs, rewards, terminations, truncations, infos = super().step(actions)
        return obs, {agent: reward[:2] for agent, reward in rewards.items()}, terminations, truncations, infos


def test_wrong_shapes_are_clear_errors() -> None:
    env = BatchedMultiAgentVecEnv(WrongRewardShape(4))
    env.reset()
    with pytest.raises(ValueError, match=r"rewards of shape \(2,\) for agent 'agent_0'; expected \(4,\)"):
        env.step_agents({agent: np.ones(4, dtype=np.int64) for agent in env.possible_agents})
    env = batched(4)
    env.reset()
    with pytest.raises(ValueError, match=r"Actions for agent 'agent_1' have shape \(3,\); expected \(4,\)"):
        env.step_agents({"agent_0": np.ones(4, dtype=np.int64), "agent_1": np.ones(3, dtype=np.int64)})


def test_what_needs_pettingzoo_copies_refuses_a_batched_env() -> None:
    with pytest.raises(TypeError, match=r"TorchChaseEnv steps 4 copies at once .*MAPPO's critic input"):
        MAPPO("MlpPolicy", TorchChaseEnv(4), critic_input="joint_obs")


def test_batched_needs_an_env_fn_that_makes_a_batched_env() -> None:
    with pytest.raises(TypeError, match=r"returned ChaseParallelEnv.*vec_env_cls='dummy'"):
        make_vec_env(lambda num_envs: ChaseParallelEnv(), 4, vec_env_cls="batched")


# --- VMAS -------------------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("continuous_actions", [True, False])
def test_ippo_trains_on_vmas(continuous_actions: bool) -> None:
    """VMAS steps the copies; each copy's episode ends at max_steps and only that copy is reset (``reset_at``)."""
    vmas = pytest.importorskip("vmas")
    env = vmas.make_env("balance", num_envs=8, continuous_actions=continuous_actions, max_steps=7, seed=0)
    model = small_model(env)
    lengths: list[int] = []
    model.learn(
        8 * 30,
        callback=lambda local_vars, _: (
            lengths.extend(info["episode"]["l"] for info in local_vars["infos"] if "episode" in info) or True
        ),
    )
    assert model.policy_version >= 1
    assert lengths and set(lengths) == {7}
    mean, _ = evaluate_policy(
        model,
        vmas.make_env("balance", num_envs=4, continuous_actions=continuous_actions, max_steps=7, seed=1),
        n_eval_episodes=4,
    )
    assert np.isfinite(mean)


def test_vmas_copies_reset_one_by_one() -> None:
    """VMAS has no automatic reset and its ``reset_at(i)`` returns the whole batch: a copy that ends is reset alone,
    and the others go on with their episodes."""
    vmas = pytest.importorskip("vmas")
    env = vmas.make_env("balance", num_envs=4, continuous_actions=True, max_steps=3, seed=0)
    vec_env = BatchedMultiAgentVecEnv(env)
    vec_env.reset()
    still = {agent: np.zeros((4, 2), np.float32) for agent in vec_env.possible_agents}
    for _ in range(2):
        before = vec_env.step_agents(still).obs
    after = vec_env.env.reset_copies(np.array([True, False, False, False]))
    assert th.equal(env.steps, th.tensor([0.0, 2.0, 2.0, 2.0]))
    for agent in vec_env.possible_agents:
        np.testing.assert_array_equal(after[agent][1:].numpy(), before[agent][1:])
    step = vec_env.step_agents(still)
    assert step.dones.tolist() == [False, True, True, True]
    assert all(step.truncations[agent][1:].all() and not step.terminations[agent].any() for agent in step.truncations)
    assert th.equal(env.steps, th.tensor([1.0, 0.0, 0.0, 0.0]))
