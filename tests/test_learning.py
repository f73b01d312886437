"""Learning checks on real tasks: slow, run with ``python -m pytest -m slow``."""

from __future__ import annotations

import pytest

from sb3_ippo import IPPO, evaluate_policy, make_vec_env
from tests.envs import CartPoleParallelEnv


@pytest.mark.slow
def test_one_agent_cartpole_reaches_400_within_100k_steps() -> None:
    """IPPO with its default hyperparameters is a sound PPO: a 1-agent CartPole-v1 learns to a mean return >= 400."""
    env = make_vec_env(CartPoleParallelEnv, n_envs=4, seed=0)
    model = IPPO("MlpPolicy", env, seed=0)
    model.learn(100_000)
    eval_env = make_vec_env(CartPoleParallelEnv, n_envs=1, seed=1000)
    mean_return, _ = evaluate_policy(model, eval_env, n_eval_episodes=20)
    assert model.num_timesteps <= 100_000
    assert mean_return >= 400, f"mean return {mean_return:.1f} after {model.num_timesteps} steps"
