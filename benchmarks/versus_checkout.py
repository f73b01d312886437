"""IPPO in this checkout against IPPO in another (the previous default, a branch), side by side on one machine.

Each round runs, in a fresh process per checkout and in alternating order (A B, B A, ...):

- **learn**: ``IPPO("MlpPolicy", env, seed=0)`` with its defaults on mpe2 ``simple_spread_v3`` (N agents,
  ``max_cycles=25``, ``--n-envs`` in-process copies, 64x64 networks), timed over ``learn(--timesteps)`` (collection
  and updates): env steps per second;
- **update** (``--update``): ``benchmarks/group_update.py`` of that checkout, one round per path: the seconds of one
  batched update of one group of N agents on the same trajectories.

Reported: per N, the median of each checkout and the ratio this / other. A process is started per measurement so
that neither checkout's imports or caches favour the other; torch runs on one thread.

Each checkout runs its own defaults. Across issue 22 they differ (n_epochs 80 and ``async_training=False`` before,
n_epochs 20 and "auto" after, which starts a learner process for ``--timesteps`` of at least 20,000 on a machine
with a second core), so **learn** then compares those settings as well as the code. **update** runs up to 80 passes
both in this checkout (its ``group_update.py`` sets n_epochs 80) and in checkouts from before issue 22.

    python benchmarks/versus_checkout.py OTHER_CHECKOUT [--agents 3 10] [--rounds 5] [--timesteps 4000] [--update]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
from collections.abc import Sequence
from pathlib import Path

HERE = Path(__file__).resolve().parent.parent

LEARN = """
import time, torch as th
th.set_num_threads(1)
from mpe2 import simple_spread_v3
import sb3_ippo
from sb3_ippo import IPPO, make_vec_env
assert sb3_ippo.__file__.startswith({checkout!r}), sb3_ippo.__file__
env = make_vec_env(simple_spread_v3.parallel_env, n_envs={n_envs}, seed=0, env_kwargs=dict(N={n_agents}, max_cycles=25))
model = IPPO("MlpPolicy", env, seed=0, policy_kwargs=dict(net_arch=[64, 64]))
start = time.perf_counter()
model.learn({timesteps})
print("RATE", model.num_timesteps / (time.perf_counter() - start), model.policy_version)
"""


def run(checkout: Path, args: list[str]) -> str:
    environment = {**os.environ, "PYTHONPATH": str(checkout)}
    return subprocess.run(args, cwd=checkout, env=environment, capture_output=True, text=True, check=True).stdout


def learn_rate(checkout: Path, n_agents: int, n_envs: int, timesteps: int) -> float:
    code = LEARN.format(checkout=str(checkout), n_envs=n_envs, n_agents=n_agents, timesteps=timesteps)
    match = re.search(r"RATE (\S+)", run(checkout, [sys.executable, "-c", code]))
    assert match is not None
    return float(match.group(1))


def update_seconds(checkout: Path, n_agents: int, n_envs: int) -> float:
    out = run(checkout, [sys.executable, "benchmarks/group_update.py", "--agents", str(n_agents), "--rounds", "1",
                         "--n-envs", str(n_envs)])
    row = [line for line in out.splitlines() if line.split() and line.split()[0] == str(n_agents)][-1]
    return float(row.split()[-2])  # the batched path's seconds


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("other", type=Path, help="the other checkout (a folder with sb3_ippo/ and benchmarks/)")
    parser.add_argument("--agents", type=int, nargs="+", default=[3, 10])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--timesteps", type=int, default=4000)
    parser.add_argument("--n-envs", type=int, default=8)
    parser.add_argument("--update", action="store_true", help="also time one batched group update")
    args = parser.parse_args(argv)
    checkouts = {"this": HERE, "other": args.other.resolve()}
    print(f"this: {HERE}\nother: {checkouts['other']}\nsimple_spread_v3, {args.n_envs} copies, "
          f"each checkout's IPPO defaults, 64x64; "
          f"{args.rounds} rounds, alternating; medians")
    for n_agents in args.agents:
        rates: dict[str, list[float]] = {name: [] for name in checkouts}
        updates: dict[str, list[float]] = {name: [] for name in checkouts}
        for round_index in range(args.rounds):
            order = list(checkouts) if round_index % 2 == 0 else list(reversed(checkouts))
            for name in order:
                rates[name].append(learn_rate(checkouts[name], n_agents, args.n_envs, args.timesteps))
                if args.update:
                    updates[name].append(update_seconds(checkouts[name], n_agents, args.n_envs))
        rate = {name: statistics.median(values) for name, values in rates.items()}
        print(f"N={n_agents} learn env steps/s: this {rate['this']:.0f}, other {rate['other']:.0f}, "
              f"this/other {rate['this'] / rate['other']:.2f}  (rounds: {rates})", flush=True)
        if args.update:
            update = {name: statistics.median(values) for name, values in updates.items()}
            print(f"N={n_agents} batched update s: this {update['this']:.3f}, other {update['other']:.3f}, "
                  f"this/other {update['this'] / update['other']:.2f}", flush=True)


if __name__ == "__main__":
    main()
