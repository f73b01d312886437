"""IPPO's training speed with ``async_training=True`` (each update in a learner process, overlapping collection)
against synchronous updates (``async_training=False``), on mpe2 ``simple_spread_v3`` (N=3, max_cycles=25).

Both run n_episodes 8, n_epochs 80 (the defaults before issue 22; n_epochs is now 20 by default), target_kl 0.02
and 64x64 networks on ``--n-envs`` copies; only ``async_training`` differs, set explicitly on both sides (its default,
"auto", would choose by budget and machine). Each round trains a fresh model of each mode for ``--timesteps`` env
steps, with each kind of env copies of ``--vec-env`` (in-process "dummy" and worker-process "subproc" by default);
the modes take turns (A B, then B A ...) and the figures are medians over the rounds. Torch runs one thread in the
main process and one in the learner, so collection and the update use one core each. An async round's whole
``learn`` includes starting its learner (a fresh interpreter importing torch: one to a few seconds) and stopping it;
its steady state runs from the first applied update to the last env step. The gain needs a second free core: on a
machine whose cores are busy it is small or none, and the load average printed says how busy it was.

    python benchmarks/async_training.py [--rounds 3] [--timesteps 12000] [--n-envs 8] [--vec-env dummy subproc]
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

from stable_baselines3.common.callbacks import BaseCallback

from sb3_ippo import IPPO

ENV_NAME = "simple_spread_v3"
MODES = {"sync": False, "async": True}  # async_training of each side: never the default "auto"
# The settings of the documented measurements (docs/benchmarks.md): n_epochs 80, the default before issue 22.
N_EPOCHS = 80


class SteadyClock(BaseCallback):
    """Notes the time and env steps when the first update has been applied, and at the last env step: the steady state
    runs between the two, without the learner's start (a fresh interpreter importing torch) before it, and without the
    last update and the learner's stop after it, which a long training pays once too."""

    def __init__(self) -> None:
        super().__init__()
        self.start: tuple[float, int] | None = None
        self.last: tuple[float, int] = (0.0, 0)

    def _on_step(self) -> bool:
        now = (time.perf_counter(), self.model.num_timesteps)
        if self.start is None and self.model.policy_version >= 1:
            self.start = now
        self.last = now
        return True


def train_rate(async_training: bool, vec_env: str, args: argparse.Namespace, seed: int) -> tuple[float, float]:
    """Env steps per wall-clock second of one fresh model's ``learn``: over the whole of it (learner start and stop
    included), and in the steady state, from the first applied update to the last env step."""
    kwargs = common.env_kwargs(ENV_NAME)
    env = common.make_ippo_env(ENV_NAME, args.n_envs, seed, kwargs, vec_env_cls=vec_env)
    model = IPPO("MlpPolicy", env, n_epochs=N_EPOCHS, async_training=async_training, seed=seed, device="cpu",
                 policy_kwargs={"net_arch": common.NET_ARCH})
    clock = SteadyClock()
    start = time.perf_counter()
    model.learn(total_timesteps=args.timesteps, callback=clock)
    end = time.perf_counter()
    env.close()
    if clock.start is None:
        raise ValueError(f"--timesteps {args.timesteps} gave no applied update before the end: raise it")
    (steady_start, steady_steps_start), (steady_end, steady_steps_end) = clock.start, clock.last
    return model.num_timesteps / (end - start), (steady_steps_end - steady_steps_start) / (steady_end - steady_start)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3, help="rounds of each mode (median is reported)")
    parser.add_argument("--timesteps", type=int, default=12_000, help="env steps per round (60 updates with 8 copies)")
    parser.add_argument("--n-envs", type=int, default=8, help="env copies")
    parser.add_argument("--vec-env", choices=["dummy", "subproc"], nargs="+", default=["dummy", "subproc"],
                        help="make_vec_env's vec_env_cls (each is measured)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, dict[str, float]]:
    """Run the benchmark, print the table, and return, per kind of env copies, the median env steps per second of
    each mode (``sync``, ``async``: whole learn; ``sync_steady``, ``async_steady``: from the first applied update to
    the last env step)
    and their ratios (``ratio``, ``ratio_steady``)."""
    args = parse_args(argv)
    common.set_torch_threads(1)
    load_before = os.getloadavg()[0]
    rates: dict[str, dict[str, list[float]]] = {
        vec_env: {f"{mode}{part}": [] for mode in MODES for part in ("", "_steady")} for vec_env in args.vec_env
    }
    for round_index in range(args.rounds):
        order = list(MODES) if round_index % 2 == 0 else list(reversed(MODES))
        for vec_env in args.vec_env:
            for mode in order:
                whole, steady = train_rate(MODES[mode], vec_env, args, args.seed + round_index)
                rates[vec_env][mode].append(whole)
                rates[vec_env][f"{mode}_steady"].append(steady)
            line = ", ".join(f"{m} {rates[vec_env][m][-1]:,.0f} (steady {rates[vec_env][f'{m}_steady'][-1]:,.0f})"
                             for m in MODES)
            print(f"round {round_index + 1} ({vec_env}): {line}; load average {os.getloadavg()[0]:.1f}", flush=True)
    results: dict[str, dict[str, float]] = {}
    print(common.machine_description())
    print(f"{ENV_NAME} (N=3, 25 cycles), {args.n_envs} copies, n_episodes 8, n_epochs {N_EPOCHS}, target_kl 0.02; "
          f"{args.rounds} rounds x {args.timesteps:,} env steps per mode, alternating (load average before: "
          f"{load_before:.1f}, after: {os.getloadavg()[0]:.1f})")
    print(f"{'copies':<9}{'mode':<14}{'env steps/s (median)':>22}{'min':>10}{'max':>10}")
    for vec_env, by_mode in rates.items():
        medians = {mode: statistics.median(values) for mode, values in by_mode.items()}
        medians["ratio"] = medians["async"] / medians["sync"]
        medians["ratio_steady"] = medians["async_steady"] / medians["sync_steady"]
        results[vec_env] = medians
        for mode, values in by_mode.items():
            print(f"{vec_env:<9}{mode:<14}{medians[mode]:>22,.0f}{min(values):>10,.0f}{max(values):>10,.0f}")
        print(f"{vec_env:<9}ratio async/sync: {medians['ratio']:.2f} (whole learn), {medians['ratio_steady']:.2f} (steady)")
    return results


if __name__ == "__main__":
    main()
