"""IPPO's training speed with ``async_training`` (each update in a learner process, overlapping collection)
against the synchronous default, on mpe2 ``simple_spread_v3`` (N=3, max_cycles=25).

Both run IPPO's defaults (n_episodes 8, n_epochs 80, target_kl 0.02) on ``--n-envs`` copies with 64x64 networks; only
``async_training`` differs. Each round trains a fresh model of each mode for ``--timesteps`` env steps, with each kind of
env copies of ``--vec-env`` (in-process "dummy" and worker-process "subproc" by default); the modes take turns (A B, then
B A ...) and the figures are medians over the rounds. Torch runs one thread in the main process and one in the learner,
so collection and the update use one core each; an async round includes starting its learner (a fresh interpreter
importing torch: one to a few seconds). The gain needs a second free core: on a machine whose cores are busy it is
small or none, and the load average printed says how busy it was.

    python benchmarks/async_training.py [--rounds 5] [--timesteps 4000] [--n-envs 8] [--vec-env dummy subproc]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

from sb3_ippo import IPPO

ENV_NAME = "simple_spread_v3"
MODES = {"sync": False, "async": True}


def train_rate(async_training: bool, vec_env: str, args: argparse.Namespace, seed: int) -> float:
    """Env steps per wall-clock second of one fresh model's ``learn`` (learner start-up included)."""
    kwargs = common.env_kwargs(ENV_NAME)
    env = common.make_ippo_env(ENV_NAME, args.n_envs, seed, kwargs, vec_env_cls=vec_env)
    model = IPPO("MlpPolicy", env, async_training=async_training, seed=seed, device="cpu",
                 policy_kwargs={"net_arch": common.NET_ARCH})
    start = time.perf_counter()
    model.learn(total_timesteps=args.timesteps)
    seconds = time.perf_counter() - start
    env.close()
    return model.num_timesteps / seconds


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of each mode (median is reported)")
    parser.add_argument("--timesteps", type=int, default=4000, help="env steps per round (20 updates with 8 copies)")
    parser.add_argument("--n-envs", type=int, default=8, help="env copies")
    parser.add_argument("--vec-env", choices=["dummy", "subproc"], nargs="+", default=["dummy", "subproc"],
                        help="make_vec_env's vec_env_cls (each is measured)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, dict[str, float]]:
    """Run the benchmark, print the table, and return, per kind of env copies, the median env steps per second of
    each mode and their ratio."""
    args = parse_args(argv)
    common.set_torch_threads(1)
    load_before = os.getloadavg()[0]
    rates: dict[str, dict[str, list[float]]] = {vec_env: {mode: [] for mode in MODES} for vec_env in args.vec_env}
    for round_index in range(args.rounds):
        order = list(MODES) if round_index % 2 == 0 else list(reversed(MODES))
        for vec_env in args.vec_env:
            for mode in order:
                rates[vec_env][mode].append(train_rate(MODES[mode], vec_env, args, args.seed + round_index))
            line = ", ".join(f"{m} {rates[vec_env][m][-1]:,.0f}" for m in MODES)
            print(f"round {round_index + 1} ({vec_env}): {line} (load average {os.getloadavg()[0]:.1f})", flush=True)
    results: dict[str, dict[str, float]] = {}
    print(common.machine_description())
    print(f"{ENV_NAME} (N=3, 25 cycles), {args.n_envs} copies, IPPO defaults; {args.rounds} rounds x {args.timesteps:,} "
          f"env steps per mode, alternating (load average before: {load_before:.1f}, after: {os.getloadavg()[0]:.1f})")
    print(f"{'copies':<9}{'mode':<8}{'env steps/s (median)':>22}{'min':>10}{'max':>10}")
    for vec_env, by_mode in rates.items():
        medians = {mode: statistics.median(values) for mode, values in by_mode.items()}
        medians["ratio"] = medians["async"] / medians["sync"]
        results[vec_env] = medians
        for mode, values in by_mode.items():
            print(f"{vec_env:<9}{mode:<8}{medians[mode]:>22,.0f}{min(values):>10,.0f}{max(values):>10,.0f}")
        print(f"{vec_env:<9}ratio async/sync: {medians['ratio']:.2f}")
    return results


if __name__ == "__main__":
    main()
