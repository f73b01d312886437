"""Where one IPPO training run spends its time: cProfile of ``IPPO.learn`` with the defaults before issue 22.

simple_spread_v3 (N=3, 25 cycles), 8 in-process copies, n_episodes 8, target_kl 0.02, batch_size None, 64x64 MLPs,
and n_epochs 80 with ``async_training=False`` (the defaults before issue 22; the defaults are now n_epochs 20 and
"auto", which would move the updates of a run of 20,000 env steps or more to a learner process, out of this
profile), ``--timesteps`` env steps, torch on one thread. The run is profiled with cProfile and the cumulative CPU
time (``time.process_time``: on a shared machine wall time would count other jobs' time slices) of the functions
that make up each step of the loop is summed into a table:

- collection (``IPPO.collect_rollouts``): env stepping (``MultiAgentVecEnv.step_agents``), the policy forward pass of
  each group or agent (``IPPO._act``), the per-agent buffers (``AgentEpisodeBuffer.add``), callbacks and episode statistics;
- update (``IPPO.train``): drain, ``build_batch`` (fresh values and log-probs, GAE) and ``ppo_update`` for agents
  updated one at a time, ``stacked_build_batch`` and ``stacked_ppo_update`` for the groups updated as one batch;
- logging (``IPPO.dump_logs``; ``_record_update`` is inside the update's figure).

Then the top lines of the profile (cumulative time). cProfile's overhead inflates functions with many small
calls (the env and the Python loop) more than torch's compiled kernels; ``py-spy record -o profile.svg -- python
benchmarks/profile_ippo.py --no-cprofile`` gives a sampling profile without that bias.

    python benchmarks/profile_ippo.py [--timesteps 20000] [--top 25] [--save runs/profile_ippo.prof]
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

from sb3_ippo import IPPO

# n_epochs 80, the default before issue 22, as in the documented profiles (docs/benchmarks.md).
N_EPOCHS = 80
# (label, file suffix, function name); indented labels are parts of the one above them.
PARTS = (
    ("learn (total)", "sb3_ippo/common/on_policy_algorithm.py", "learn"),
    ("collection", "sb3_ippo/common/on_policy_algorithm.py", "collect_rollouts"),
    ("  env stepping (step_agents)", "sb3_ippo/vec_env/base.py", "step_agents"),
    ("  policy forward (_act: per group or agent)", "sb3_ippo/common/on_policy_algorithm.py", "_act"),
    ("  buffer add", "sb3_ippo/common/buffer.py", "add"),
    ("  callbacks (on_step)", "stable_baselines3/common/callbacks.py", "on_step"),
    ("  episode statistics", "stable_baselines3/common/base_class.py", "_update_info_buffer"),
    ("update (train)", "ippo/ippo.py", "train"),
    ("  drain", "sb3_ippo/common/buffer.py", "drain"),
    ("  build_batch (one agent: recompute, GAE)", "sb3_ippo/update/batch.py", "build_batch"),
    ("  ppo_update (one agent)", "sb3_ippo/update/ppo.py", "ppo_update"),
    ("  stacked_build_batch (a group)", "sb3_ippo/update/stacked_update.py", "stacked_build_batch"),
    ("  stacked_ppo_update (a group)", "sb3_ippo/update/stacked_update.py", "stacked_ppo_update"),
    ("  record statistics", "sb3_ippo/common/on_policy_algorithm.py", "_record_update"),
    ("logging (dump_logs)", "sb3_ippo/common/on_policy_algorithm.py", "dump_logs"),
)


def cumulative_seconds(stats: pstats.Stats, suffix: str, name: str) -> tuple[float, int]:
    """Cumulative time and call count of the function ``name`` defined in a file ending with ``suffix``."""
    seconds, calls = 0.0, 0
    for (filename, _, funcname), (_, n_calls, _, cumtime, _) in stats.stats.items():  # type: ignore[attr-defined]
        if funcname == name and filename.replace("\\", "/").endswith(suffix):
            seconds += cumtime
            calls += n_calls
    return seconds, calls


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--timesteps", type=int, default=20_000, help="env steps of the profiled run")
    parser.add_argument("--n-envs", type=int, default=8, help="env copies")
    parser.add_argument("--top", type=int, default=25, help="lines of the profile to print")
    parser.add_argument("--save", type=Path, default=None, help="write the raw profile here (for snakeviz, pstats)")
    parser.add_argument("--no-cprofile", action="store_true", help="run without cProfile (for py-spy)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    """Profile the run, print the table and the top lines; return the seconds of each part."""
    args = parse_args(argv)
    common.set_torch_threads(1)
    kwargs = common.env_kwargs("simple_spread_v3")
    env = common.make_ippo_env("simple_spread_v3", args.n_envs, args.seed, kwargs)
    # async_training=False: every update in this process, where cProfile sees it.
    model = IPPO("MlpPolicy", env, n_epochs=N_EPOCHS, async_training=False, seed=args.seed, device="cpu")
    if args.no_cprofile:
        start = time.perf_counter()
        model.learn(total_timesteps=args.timesteps)
        print(f"{args.timesteps:,} env steps in {time.perf_counter() - start:.1f} s")
        return {}
    # CPU time of this process, not wall time: on a shared machine wall time counts other jobs' time slices.
    profiler = cProfile.Profile(time.process_time)
    wall_start = time.perf_counter()
    profiler.runcall(model.learn, total_timesteps=args.timesteps)
    wall = time.perf_counter() - wall_start
    env.close()
    if args.save is not None:
        args.save.parent.mkdir(parents=True, exist_ok=True)
        profiler.dump_stats(args.save)
    stats = pstats.Stats(profiler)
    total, _ = cumulative_seconds(stats, "sb3_ippo/common/on_policy_algorithm.py", "learn")

    print(common.machine_description())
    print(
        f"IPPO with n_epochs {N_EPOCHS} and async_training=False (the defaults before issue 22) on simple_spread_v3 "
        f"{kwargs}, {args.n_envs} copies, {args.timesteps:,} env steps, {model.policy_version} updates; "
        f"{total:.1f} CPU s under cProfile ({wall:.1f} s wall)"
    )
    print(f"{'part':<44}{'CPU s':>10}{'share':>8}{'calls':>10}")
    parts: dict[str, float] = {}
    for label, suffix, name in PARTS:
        seconds, calls = cumulative_seconds(stats, suffix, name)
        parts[label.strip()] = seconds
        print(f"{label:<44}{seconds:>10.2f}{seconds / total:>8.1%}{calls:>10,}")
    rest = total - parts["collection"] - parts["update (train)"] - parts["logging (dump_logs)"]
    print(f"{'other (learn setup, loop)':<44}{rest:>10.2f}{rest / total:>8.1%}")

    text = io.StringIO()
    pstats.Stats(profiler, stream=text).strip_dirs().sort_stats("cumulative").print_stats(args.top)
    lines = text.getvalue().splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith("ncalls"))
    print("\n".join(lines[start : start + args.top + 1]))
    return parts


if __name__ == "__main__":
    main()
