"""IPPO with continuous actions: mpe2's simple_spread_v3 with ``continuous_actions=True``.

Each agent's action is a Box(0, 1, (5,)) of forces (no-op, left, right, down, up); each agent's MlpPolicy is then a
diagonal Gaussian, whose samples IPPO clips to the action bounds before the env sees them (as SB3's PPO does).
The example trains on 8 env copies, saves, loads, and prints the team return over evaluation episodes.

    python examples/continuous_spread.py                      # 50k env steps, a couple of minutes on 2 cores
    python examples/continuous_spread.py --timesteps 200000
"""

from __future__ import annotations

import argparse
import pathlib
import time
from collections.abc import Sequence

from mpe2 import simple_spread_v3

from sb3_ippo import IPPO, evaluate_policy, make_vec_env

ENV_KWARGS = dict(N=3, max_cycles=25, continuous_actions=True)


def main(argv: Sequence[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timesteps", type=int, default=50_000, help="env steps to train for (default: 50000)")
    parser.add_argument("--eval-episodes", type=int, default=50, help="evaluation episodes (default: 50)")
    parser.add_argument("--out", default="runs/examples", help="folder of the saved model (default: runs/examples)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    env = make_vec_env(simple_spread_v3.parallel_env, n_envs=8, seed=args.seed, env_kwargs=ENV_KWARGS)
    # At most 20 passes per update (IPPO's default) at a learning rate of 1e-3 instead of the default 3e-4, as in
    # simple_spread.py.
    model = IPPO("MlpPolicy", env, n_epochs=20, learning_rate=1e-3, seed=args.seed, verbose=1)
    print(f"Action space of agent_0: {model.policies['agent_0'].action_space}")
    start = time.perf_counter()
    model.learn(total_timesteps=args.timesteps, log_interval=25)
    elapsed = time.perf_counter() - start
    print(f"Trained for {model.num_timesteps} env steps ({model.policy_version} updates) in {elapsed:.0f} s")

    path = pathlib.Path(args.out) / "ippo_continuous_spread.zip"
    path.parent.mkdir(parents=True, exist_ok=True)
    model.save(path)
    env.close()
    model = IPPO.load(path)

    eval_env = make_vec_env(simple_spread_v3.parallel_env, n_envs=1, seed=args.seed + 1000, env_kwargs=ENV_KWARGS)
    mean, std = evaluate_policy(model, eval_env, n_eval_episodes=args.eval_episodes)
    eval_env.close()
    print(f"Team return over {args.eval_episodes} episodes: {mean:.2f} +/- {std:.2f}")
    return float(mean)


if __name__ == "__main__":
    main()
