"""IPPO on mpe2's simple_spread_v3: three agents with discrete actions learn to cover three landmarks.

Every agent gets its own MlpPolicy. The example builds 8 env copies with ``make_vec_env``, trains, saves the
model to one zip, loads it back and prints the team return (the sum of the agents' rewards over an episode)
over evaluation episodes. A random policy scores about -80.

    python examples/simple_spread.py                      # 50k env steps, a couple of minutes on 2 cores
    python examples/simple_spread.py --timesteps 200000   # about -64, in some 7 CPU-minutes
"""

from __future__ import annotations

import argparse
import pathlib
import time
from collections.abc import Sequence

from mpe2 import simple_spread_v3

from sb3_ippo import IPPO, evaluate_policy, make_vec_env

ENV_KWARGS = dict(N=3, max_cycles=25)


def main(argv: Sequence[str] | None = None) -> float:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timesteps", type=int, default=50_000, help="env steps to train for (default: 50000)")
    parser.add_argument("--eval-episodes", type=int, default=50, help="evaluation episodes (default: 50)")
    parser.add_argument("--out", default="runs/examples", help="folder of the saved model (default: runs/examples)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    env = make_vec_env(simple_spread_v3.parallel_env, n_envs=8, seed=args.seed, env_kwargs=ENV_KWARGS)
    # An update every 8 finished episodes per agent (200 transitions each) and at most 20 passes, as IPPO's defaults
    # do, but at a learning rate of 1e-3 instead of 3e-4. Against IPPO's earlier defaults (80 passes at 3e-4) it
    # learned as much for less than half the CPU time (measured at 30k env steps: -69.6 in 98 CPU-seconds, against
    # -71.1 in 224).
    model = IPPO("MlpPolicy", env, n_episodes=8, n_epochs=20, learning_rate=1e-3, seed=args.seed, verbose=1)
    start = time.perf_counter()
    model.learn(total_timesteps=args.timesteps, log_interval=25)
    elapsed = time.perf_counter() - start
    print(f"Trained for {model.num_timesteps} env steps ({model.policy_version} updates) in {elapsed:.0f} s")

    path = pathlib.Path(args.out) / "ippo_simple_spread.zip"
    path.parent.mkdir(parents=True, exist_ok=True)
    model.save(path)
    env.close()
    model = IPPO.load(path)

    eval_env = make_vec_env(simple_spread_v3.parallel_env, n_envs=1, seed=args.seed + 1000, env_kwargs=ENV_KWARGS)
    mean, std = evaluate_policy(model, eval_env, n_eval_episodes=args.eval_episodes)
    print(f"Team return over {args.eval_episodes} episodes: {mean:.2f} +/- {std:.2f}")
    eval_env.close()
    return float(mean)


if __name__ == "__main__":
    main()
