"""IPPO with recurrent policies (sb3-contrib's MlpLstmPolicy) on a partially observable simple_spread_v3.

Each agent's own velocity is removed from its observation (SuperSuit's ``observation_lambda_v0``), so the task is
partially observable: an agent sees where it is, not how it moves. Every agent gets its own LSTM policy, whose state
is carried through the agent's episode during collection and which is trained on whole trajectories. The example
trains, saves the model to one zip, loads it back, evaluates it (``evaluate_policy`` carries every agent's state
through each episode) and then plays one episode by hand with ``predict``'s recurrent convention: the dict of states
the previous call returned goes into the next, and ``episode_start`` resets them.

    python examples/recurrent_spread.py                      # 30k env steps, some minutes on 2 cores
    python examples/recurrent_spread.py --timesteps 100000
"""

from __future__ import annotations

import argparse
import pathlib
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
import supersuit as ss
from gymnasium import spaces
from mpe2 import simple_spread_v3
from pettingzoo import ParallelEnv

from sb3_ippo import IPPO, evaluate_policy, make_vec_env

ENV_KWARGS = dict(N=3, max_cycles=25)


def partially_observable_spread(**kwargs: Any) -> ParallelEnv:
    """simple_spread_v3 without each agent's own velocity (the first two entries of its observation)."""
    env = simple_spread_v3.parallel_env(**{**ENV_KWARGS, **kwargs})
    return ss.observation_lambda_v0(
        env,
        lambda obs, _space: obs[2:],
        lambda space: spaces.Box(space.low[2:], space.high[2:], dtype=space.dtype),
    )


def play_one_episode(model: IPPO, seed: int) -> float:
    """One episode with ``predict``, carrying each agent's state by hand (as ``evaluate_policy`` does)."""
    env = partially_observable_spread()
    obs, _ = env.reset(seed=seed)
    states = None  # None: every agent starts from zeros
    episode_start = np.ones(1, dtype=bool)
    team_return = 0.0
    while env.agents:
        batched = {agent: obs[agent][None] for agent in env.agents}  # one row per agent: a batch of one copy
        actions, states = model.predict(batched, state=states, episode_start=episode_start, deterministic=True)
        obs, rewards, _, _, _ = env.step({agent: int(actions[agent][0]) for agent in env.agents})
        team_return += sum(rewards.values())
        episode_start = np.zeros(1, dtype=bool)
    return team_return


def main(argv: Sequence[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timesteps", type=int, default=30_000, help="env steps to train for (default: 30000)")
    parser.add_argument("--eval-episodes", type=int, default=50, help="evaluation episodes (default: 50)")
    parser.add_argument("--out", default="runs/examples", help="folder of the saved model (default: runs/examples)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    env = make_vec_env(partially_observable_spread, n_envs=8, seed=args.seed)
    # An LSTM of 64 units after the features, then one hidden layer of 64 (actor and critic have their own LSTM).
    policy_kwargs = dict(lstm_hidden_size=64, net_arch=[64])
    model = IPPO("MlpLstmPolicy", env, policy_kwargs=policy_kwargs, learning_rate=1e-3, seed=args.seed, verbose=1)
    start = time.perf_counter()
    model.learn(total_timesteps=args.timesteps, log_interval=25)
    elapsed = time.perf_counter() - start
    print(f"Trained for {model.num_timesteps} env steps ({model.policy_version} updates) in {elapsed:.0f} s")

    path = pathlib.Path(args.out) / "ippo_recurrent_spread.zip"
    path.parent.mkdir(parents=True, exist_ok=True)
    model.save(path)
    env.close()
    model = IPPO.load(path)

    eval_env = make_vec_env(partially_observable_spread, n_envs=1, seed=args.seed + 1000)
    mean, std = evaluate_policy(model, eval_env, n_eval_episodes=args.eval_episodes)
    print(f"Team return over {args.eval_episodes} episodes: {mean:.2f} +/- {std:.2f}")
    eval_env.close()
    print(f"One episode played with predict(obs, state=..., episode_start=...): {play_one_episode(model, args.seed):.2f}")
    return float(mean)


if __name__ == "__main__":
    main()
