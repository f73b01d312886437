"""IPPO on mpe2's simple_adversary_v3: heterogeneous agents, each with its own policy built from its own spaces.

The adversary sees 8 numbers, the two good agents 10 each: IPPO builds one MlpPolicy per agent from that agent's
observation space, with nothing to configure. The sides compete (the good agents are paid for keeping the
adversary away from the target landmark), so the team return (the sum over all agents) says little; the example
prints each side's return, from the per-agent returns that ``make_vec_env`` reports at the end of every
episode (``infos[i]["episode"]["agent_returns"]``).

    python examples/simple_adversary.py                      # 50k env steps, a couple of minutes on 2 cores
    python examples/simple_adversary.py --timesteps 200000
"""

from __future__ import annotations

import argparse
import pathlib
import time
from collections.abc import Sequence
from typing import Any

import numpy as np
from mpe2 import simple_adversary_v3

from sb3_ippo import IPPO, evaluate_policy, make_vec_env

ENV_KWARGS = dict(N=2, max_cycles=25)


def side_returns(agent_returns: dict[str, float]) -> tuple[float, float]:
    """(adversary, good agents) returns of one episode: each side's agents' returns summed."""
    adversary = sum(value for agent, value in agent_returns.items() if agent.startswith("adversary"))
    good = sum(value for agent, value in agent_returns.items() if not agent.startswith("adversary"))
    return adversary, good


def main(argv: Sequence[str] | None = None) -> tuple[float, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timesteps", type=int, default=50_000, help="env steps to train for (default: 50000)")
    parser.add_argument("--eval-episodes", type=int, default=50, help="evaluation episodes (default: 50)")
    parser.add_argument("--out", default="runs/examples", help="folder of the saved model (default: runs/examples)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    env = make_vec_env(simple_adversary_v3.parallel_env, n_envs=8, seed=args.seed, env_kwargs=ENV_KWARGS)
    # At most 20 passes per update (IPPO's default) at a learning rate of 1e-3 instead of the default 3e-4, as in
    # simple_spread.py.
    model = IPPO("MlpPolicy", env, n_epochs=20, learning_rate=1e-3, seed=args.seed, verbose=1)
    for agent, policy in model.policies.items():
        print(f"{agent}: observation {policy.observation_space.shape}, action {policy.action_space}")
    start = time.perf_counter()
    # rollout/<agent>/ep_rew_mean in the log shows each agent's return as training goes.
    model.learn(total_timesteps=args.timesteps, log_interval=25)
    elapsed = time.perf_counter() - start
    print(f"Trained for {model.num_timesteps} env steps ({model.policy_version} updates) in {elapsed:.0f} s")

    path = pathlib.Path(args.out) / "ippo_simple_adversary.zip"
    path.parent.mkdir(parents=True, exist_ok=True)
    model.save(path)
    env.close()
    model = IPPO.load(path)

    # evaluate_policy scores the team return; its callback sees each finished episode's per-agent returns.
    sides: list[tuple[float, float]] = []

    def record_sides(local_vars: dict[str, Any], _globals: dict[str, Any]) -> None:
        episode = local_vars["info"].get("episode")
        if local_vars["done"] and episode is not None:
            sides.append(side_returns(episode["agent_returns"]))

    eval_env = make_vec_env(simple_adversary_v3.parallel_env, n_envs=1, seed=args.seed + 1000, env_kwargs=ENV_KWARGS)
    mean, std = evaluate_policy(model, eval_env, n_eval_episodes=args.eval_episodes, callback=record_sides)
    eval_env.close()
    adversary, good = np.mean(sides, axis=0)
    print(
        f"Over {args.eval_episodes} episodes: adversary return {adversary:.2f}, good agents' return {good:.2f} "
        f"(team return {mean:.2f} +/- {std:.2f})"
    )
    return float(adversary), float(good)


if __name__ == "__main__":
    main()
