"""MAPPO against IPPO (and the peer) along the way: the mean training-episode team return in windows of env steps,
read from the runs that ``benchmarks/time_to_quality.py`` recorded (``--out``/runs/<task>_<algo>_seed<S>.csv).

For each algorithm and each checkpoint C (default: every 10% of the budget), the figure is the mean team return of
the training episodes that ended in (0.9 C, C], as time_to_quality's equal-steps figure reads it at its budget; over
seeds: mean and min..max.

    python benchmarks/time_to_quality.py --tasks simple_spread_v3 --algos peer ippo mappo --timesteps 100000 --out OUT
    python benchmarks/mappo_vs_ippo.py OUT --task simple_spread_v3 --budget 100000 [--algos ippo mappo peer]
"""

from __future__ import annotations

import argparse
import csv
from collections.abc import Sequence
from pathlib import Path

import numpy as np


def read_episodes(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """(env steps at each episode's end, its team return) of one recorded run."""
    with open(path) as file:
        rows = list(csv.DictReader(file))
    return np.array([float(r["env_steps"]) for r in rows]), np.array([float(r["episode_return"]) for r in rows])


def window_mean(steps: np.ndarray, returns: np.ndarray, checkpoint: float) -> float:
    inside = (steps > 0.9 * checkpoint) & (steps <= checkpoint)
    return float(returns[inside].mean()) if inside.any() else float("nan")


def table(out: Path, task: str, algos: Sequence[str], budget: int, n_points: int) -> str:
    checkpoints = [round(budget * (i + 1) / n_points) for i in range(n_points)]
    lines = [f"{task}: mean training-episode team return over (0.9 C, C] env steps; mean over seeds [min..max]"]
    lines.append(f"{'env steps C':>12}  " + "  ".join(f"{algo:>28}" for algo in algos))
    runs = {algo: sorted((out / "runs").glob(f"{task}_{algo}_seed*.csv")) for algo in algos}
    episodes = {algo: [read_episodes(path) for path in paths] for algo, paths in runs.items()}
    for checkpoint in checkpoints:
        cells = []
        for algo in algos:
            values = [window_mean(steps, returns, checkpoint) for steps, returns in episodes[algo]]
            values = [v for v in values if np.isfinite(v)]
            cells.append(
                f"{np.mean(values):8.2f} [{min(values):7.2f}..{max(values):7.2f}] n={len(values)}" if values else f"{'-':>28}"
            )
        lines.append(f"{checkpoint:>12,}  " + "  ".join(f"{cell:>28}" for cell in cells))
    seeds = {algo: [path.stem.rsplit("_seed", 1)[1] for path in paths] for algo, paths in runs.items()}
    lines.append("seeds: " + "; ".join(f"{algo} {','.join(s) or 'none'}" for algo, s in seeds.items()))
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("out", type=Path, help="a time_to_quality.py --out folder")
    parser.add_argument("--task", default="simple_spread_v3")
    parser.add_argument("--algos", nargs="+", default=["ippo", "mappo", "peer"])
    parser.add_argument("--budget", type=int, required=True, help="env steps of the last checkpoint")
    parser.add_argument("--points", type=int, default=10, help="checkpoints, evenly spaced up to the budget")
    args = parser.parse_args(argv)
    text = table(args.out, args.task, args.algos, args.budget, args.points)
    print(text)
    return text


if __name__ == "__main__":
    main()
