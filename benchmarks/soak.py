"""Soak test: one long IPPO run on env copies that fail now and then, watching memory and the buffers over time.

Trains IPPO (64x64 networks; ``--n-epochs`` 80 and ``async_training=False``: the defaults before issue 22, now
n_epochs 20 and "auto"; so every update runs in this process, whose memory is watched) on mpe2 ``simple_spread_v3``
(N=3, max_cycles=25) for ``--minutes`` of wall time, on ``--n-envs`` copies in worker processes with
``on_env_error="restart"``. Every copy's env is wrapped to fail at random: it raises in ``step`` with probability
``--raise-prob`` per step, and (worker processes only) kills its whole worker process with probability
``--exit-prob``, so both restart paths (a copy rebuilt in its worker, a dead worker started anew) run all along.
Every ``--report-seconds`` a line gives the resident memory of this process and of the workers
(``/proc/<pid>/statm``), the trajectories waiting in the buffers and in progress, and the counters. At the end: the
restarts survived, and the growth of this process's resident memory from the end of the warm-up
(``--warmup-minutes``) to the end of the run, with its maximum and its linear trend, and a check that the model
saves and loads (both formats) to the same actions.

    nice -n 19 python benchmarks/soak.py [--minutes 30] [--n-envs 8] [--out docs/benchmarks/soak.txt]

(From a checkout that is not the installed package, put it first on the path: ``PYTHONPATH=. python ...``.)
"""

from __future__ import annotations

import argparse
import functools
import os
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, ClassVar

import numpy as np
from pettingzoo import ParallelEnv
from stable_baselines3.common.callbacks import BaseCallback

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

from sb3_ippo import IPPO, make_vec_env

ENV_NAME = "simple_spread_v3"
PAGE_SIZE = os.sysconf("SC_PAGE_SIZE")


class FlakyParallelEnv(ParallelEnv):
    """A PettingZoo parallel env that fails at random: it raises in ``step`` with probability ``raise_prob``, and
    ends its process with probability ``exit_prob`` (as a crashing simulator would). Its generator is seeded by its
    first seeded reset, so a seeded run fails at the same steps."""

    metadata: ClassVar[dict[str, Any]] = {"name": "flaky_v0", "render_modes": [], "is_parallelizable": True}

    def __init__(self, env: ParallelEnv, raise_prob: float, exit_prob: float) -> None:
        self.env = env
        self.raise_prob = raise_prob
        self.exit_prob = exit_prob
        self.possible_agents = list(env.possible_agents)
        self.render_mode = None
        self.rng = np.random.default_rng()
        self._seeded = False

    @property
    def agents(self) -> list[str]:  # type: ignore[override]
        return self.env.agents

    def observation_space(self, agent: str) -> Any:
        return self.env.observation_space(agent)

    def action_space(self, agent: str) -> Any:
        return self.env.action_space(agent)

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        if seed is not None and not self._seeded:
            self.rng, self._seeded = np.random.default_rng(seed + 7919), True
        return self.env.reset(seed=seed, options=options)

    def step(self, actions: dict[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        draw = self.rng.random()
        if draw < self.exit_prob:
            os._exit(7)
        if draw < self.exit_prob + self.raise_prob:
            raise RuntimeError("FlakyParallelEnv failed on purpose")
        return self.env.step(actions)

    def close(self) -> None:
        self.env.close()


def make_flaky_env(env_fn: Any, raise_prob: float, exit_prob: float, **kwargs: Any) -> FlakyParallelEnv:
    # Refers to no module of the benchmarks: the worker processes need not import them to build it.
    return FlakyParallelEnv(env_fn(**kwargs), raise_prob, exit_prob)


def resident_mb(pid: int | str = "self") -> float:
    """Resident memory of a process, in MB (0 if it is gone)."""
    try:
        with open(f"/proc/{pid}/statm") as statm:
            return int(statm.read().split()[1]) * PAGE_SIZE / 2**20
    except (OSError, IndexError, ValueError):
        return 0.0


class SoakMonitor(BaseCallback):
    """Prints a report line every ``report_seconds`` and stops training after ``seconds``."""

    HEADER = (
        f"{'minutes':>8} {'env_steps':>10} {'version':>8} {'rss_MB':>8} {'workers_MB':>10} {'finished':>9} "
        f"{'open':>5} {'restarts':>9} {'lost':>6} {'stale':>6}"
    )

    def __init__(self, seconds: float, report_seconds: float, print_line: Any) -> None:
        super().__init__()
        self.seconds = seconds
        self.report_seconds = report_seconds
        self.print_line = print_line
        self.rows: list[dict[str, float]] = []
        self.start = self.next_report = 0.0

    def _on_training_start(self) -> None:
        self.start = time.monotonic()
        self.next_report = self.start
        self.print_line(self.HEADER)

    def report(self) -> None:
        model = self.model
        processes = getattr(model.env, "processes", [])
        row = {
            "minutes": (time.monotonic() - self.start) / 60,
            "env_steps": model.num_timesteps,
            "version": model.policy_version,
            "rss_mb": resident_mb(),
            "workers_mb": sum(resident_mb(process.pid) for process in processes if process.is_alive()),
            "finished": sum(len(buffer.finished) for buffer in model.buffers.values()),
            "open": sum(trajectory is not None for buffer in model.buffers.values() for trajectory in buffer._open),
            "restarts": model.env_restarts,
            "lost": model.episodes_lost,
            "stale": model.stale_episodes_dropped,
        }
        self.rows.append(row)
        self.print_line(
            f"{row['minutes']:8.2f} {row['env_steps']:10d} {row['version']:8d} {row['rss_mb']:8.1f} "
            f"{row['workers_mb']:10.1f} {row['finished']:9d} {row['open']:5d} {row['restarts']:9d} {row['lost']:6d} "
            f"{row['stale']:6d}"
        )

    def _on_step(self) -> bool:
        now = time.monotonic()
        if now >= self.next_report:
            self.report()
            self.next_report += self.report_seconds
        return now - self.start < self.seconds


def memory_growth(rows: list[dict[str, float]], warmup_minutes: float) -> dict[str, float]:
    """This process's resident memory after the warm-up: at its end (baseline), at the end of the run, the
    maximum, the growth (end against baseline, %) and the linear trend (MB per hour)."""
    after = [row for row in rows if row["minutes"] >= warmup_minutes] or rows[-1:]
    minutes = np.array([row["minutes"] for row in after])
    rss = np.array([row["rss_mb"] for row in after])
    slope = float(np.polyfit(minutes, rss, 1)[0] * 60) if len(after) > 1 else 0.0
    baseline, final = float(rss[0]), float(rss[-1])
    return {
        "baseline_mb": baseline,
        "final_mb": final,
        "max_mb": float(rss.max()),
        "growth_percent": 100 * (final - baseline) / baseline,
        "max_growth_percent": 100 * (float(rss.max()) - baseline) / baseline,
        "trend_mb_per_hour": slope,
    }


def check_save_load(model: IPPO) -> bool:
    """Whether the model, saved and loaded in both formats, predicts the same deterministic actions."""
    observations = {
        agent: np.stack([model.observation_spaces[agent].sample() for _ in range(32)]) for agent in model.possible_agents
    }
    expected, _ = model.predict(observations, deterministic=True)
    with tempfile.TemporaryDirectory() as directory:
        for name, trusted in (("model.zip", False), ("model.safetensors", False)):
            model.save(Path(directory) / name)
            actions, _ = IPPO.load(Path(directory) / name, trusted=trusted).predict(observations, deterministic=True)
            if any(not np.array_equal(actions[agent], expected[agent]) for agent in expected):
                return False
    return True


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--minutes", type=float, default=30.0, help="wall-clock length of the run")
    parser.add_argument("--warmup-minutes", type=float, default=5.0, help="memory growth is measured after this")
    parser.add_argument("--report-seconds", type=float, default=60.0, help="seconds between report lines")
    parser.add_argument("--n-envs", type=int, default=8, help="env copies")
    parser.add_argument("--vec-env", choices=["dummy", "subproc"], default="subproc", help="make_vec_env's vec_env_cls")
    parser.add_argument("--raise-prob", type=float, default=2e-4, help="per copy and step: the env raises")
    parser.add_argument("--exit-prob", type=float, default=2e-5, help="per copy and step: the worker dies (subproc)")
    parser.add_argument("--net-arch", type=int, nargs="+", default=common.NET_ARCH)
    parser.add_argument("--n-epochs", type=int, default=80,
                        help="IPPO's n_epochs (80: the default before issue 22; small for the smoke test)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--out", type=Path, default=None, help="also write the report to this file")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, Any]:
    """Run the soak; print (and write, with ``--out``) the report; return its figures."""
    args = parse_args(argv)
    if args.vec_env == "dummy" and args.exit_prob > 0:
        raise SystemExit("--exit-prob would end this very process with --vec-env dummy: use subproc, or 0")
    common.set_torch_threads(1)
    lines: list[str] = []

    def print_line(line: str) -> None:
        print(line, flush=True)
        lines.append(line)

    print_line(f"soak: {args.minutes} min, {args.n_envs} copies ({args.vec_env}), raise_prob {args.raise_prob}, "
               f"exit_prob {args.exit_prob}, seed {args.seed}")
    print_line(common.machine_description())
    env_fn = functools.partial(
        make_flaky_env, common.env_fn(ENV_NAME), args.raise_prob, args.exit_prob, **common.env_kwargs(ENV_NAME)
    )
    env = make_vec_env(env_fn, n_envs=args.n_envs, seed=args.seed, vec_env_cls=args.vec_env, on_env_error="restart",
                       max_restarts=10**9)
    # async_training=False: the updates run in this process, whose memory the report follows (not in a learner).
    model = IPPO("MlpPolicy", env, n_epochs=args.n_epochs, async_training=False, seed=args.seed, device="cpu",
                 policy_kwargs={"net_arch": args.net_arch})
    monitor = SoakMonitor(args.minutes * 60, args.report_seconds, print_line)
    model.learn(total_timesteps=10**12, callback=monitor)
    monitor.report()
    env.close()
    growth = memory_growth(monitor.rows, args.warmup_minutes)
    saved_and_loaded = check_save_load(model)
    summary = {
        "env_steps": model.num_timesteps,
        "updates": model.policy_version,
        "env_restarts": model.env_restarts,
        "episodes_lost": model.episodes_lost,
        "save_load_ok": saved_and_loaded,
        **growth,
    }
    print_line(
        f"restarts survived: {model.env_restarts} ({model.episodes_lost} trajectories in progress lost) in "
        f"{model.num_timesteps} env steps, {model.policy_version} updates"
    )
    print_line(
        f"resident memory after {args.warmup_minutes} min warm-up: {growth['baseline_mb']:.1f} MB -> "
        f"{growth['final_mb']:.1f} MB at the end ({growth['growth_percent']:+.2f}%), max {growth['max_mb']:.1f} MB "
        f"({growth['max_growth_percent']:+.2f}%), trend {growth['trend_mb_per_hour']:+.2f} MB/hour"
    )
    print_line(f"save and load (zip and safetensors, trusted=False) give the same actions: {saved_and_loaded}")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text("\n".join(lines) + "\n")
    return summary


if __name__ == "__main__":
    main()
