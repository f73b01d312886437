"""Scaling with the number of agents: training cost per agent-step on simple_spread_v3 with N = 3, 6, 10.

The setup of ``benchmarks/throughput.py`` (8 in-process copies, 64x64 MLPs, 10 epochs, minibatch 256,
``target_kl=None``, the same agent-transitions per update for both, updates in the training process), repeated for
each N. Per update, each IPPO agent trains on ``peer_n_steps x n_envs`` of its own transitions; the peer trains its
one network on those of all N agents together, so the gradient steps per update are about the same for both at every
N. Rounds alternate the two algorithms; the figures are medians. The cost is wall-clock microseconds per agent-step
(env steps x N), collection and updates together; "x N=3" is the cost relative to N=3, and IPPO/peer the ratio of
costs (above 1: IPPO is slower).

    python benchmarks/scaling.py [--agents 3 6 10] [--rounds 3] [--timesteps 3200] [--defaults]

With ``--defaults`` both run their own defaults, as ``throughput.py --defaults`` does (use ``--timesteps`` of at least
16,384 env steps, the peer's update interval at N=3; from 20,000 env steps on a machine with a second core, IPPO's
default ``async_training="auto"`` runs its updates in a learner process).
"""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
import throughput


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, nargs="+", default=[3, 6, 10], help="simple_spread's N values")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each algorithm per N (median is reported)")
    parser.add_argument("--timesteps", type=int, default=3200, help="env steps per round (default: 2 updates)")
    parser.add_argument("--n-envs", type=int, default=8, help="env copies")
    parser.add_argument("--peer-n-steps", type=int, default=200, help="the peer's n_steps per VecEnv entry")
    parser.add_argument("--batch-size", type=int, default=256, help="minibatch size of both")
    parser.add_argument("--n-epochs", type=int, default=10, help="passes per update of both")
    parser.add_argument("--defaults", action="store_true", help="each library's own defaults (see throughput.py)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[int, dict[str, float]]:
    """Run the benchmark, print the table, and return the median microseconds per agent-step, per N and algorithm."""
    args = parse_args(argv)
    common.set_torch_threads(1)
    costs: dict[int, dict[str, float]] = {}
    for n_agents in args.agents:
        kwargs = common.env_kwargs(throughput.ENV_NAME, n_agents)
        rates = throughput.compare(args, kwargs, list(throughput.BUILDERS))
        costs[n_agents] = {name: 1e6 / statistics.median(values) for name, values in rates.items()}
        print(f"N={n_agents}: " + ", ".join(f"{name} {cost:,.0f} us/agent-step" for name, cost in costs[n_agents].items()),
              flush=True)
    print(common.machine_description())
    setup = (
        "each library's defaults"
        if args.defaults
        else f"n_epochs {args.n_epochs}, batch_size {args.batch_size}, {args.peer_n_steps * args.n_envs} transitions per "
        "agent per update, target_kl None"
    )
    print(f"simple_spread_v3 (max_cycles 25), {args.n_envs} copies, 64x64 MLPs, {setup}; {args.rounds} rounds x "
          f"{args.timesteps:,} env steps per N, alternating")
    first = costs[args.agents[0]]
    print(f"{'N':>4}{'IPPO us/agent-step':>20}{'x N=' + str(args.agents[0]):>8}{'peer us/agent-step':>20}"
          f"{'x N=' + str(args.agents[0]):>8}{'IPPO/peer':>11}")
    for n_agents, cost in costs.items():
        print(
            f"{n_agents:>4}{cost['ippo']:>20,.0f}{cost['ippo'] / first['ippo']:>8.2f}{cost['peer']:>20,.0f}"
            f"{cost['peer'] / first['peer']:>8.2f}{cost['ippo'] / cost['peer']:>11.2f}"
        )
    return costs


if __name__ == "__main__":
    main()
