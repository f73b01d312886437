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

**One group's update, batched against the reference** (``--group-update``, formerly ``benchmarks/group_update.py``):
the update of one group of N agents, batched (``batched=True``: stacked networks, one forward/backward/Adam step per
minibatch for the group) against the one-agent-at-a-time reference path (``batched=False``), on mpe2
``simple_spread_v3`` with N = 3, 6, 10 agents. For each N: one model with n_episodes 8, n_epochs 80 (the defaults
before issue 22; the default is now 20), target_kl 0.02, whole-batch minibatches, normalized returns and 64x64
networks collects one update's worth of trajectories from ``--n-envs`` env copies. Then, round after round, fresh
copies of the untrained model update on exactly those trajectories in this process, the two paths taking turns
(A B A B ...). Both paths give the same parameters and run the same passes (``tests/test_groups.py``), so the times
compare equal work. Reported: the median seconds of one update and the ratio batched / reference.

    python benchmarks/profile_ippo.py --group-update [--agents 3 6 10] [--rounds 7] [--n-envs 8]
"""

from __future__ import annotations

import argparse
import copy
import cProfile
import io
import pstats
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

from stable_baselines3.common.logger import configure

from sb3_ippo import IPPO
from sb3_ippo.update.trainer import UpdateJob

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
    parser.add_argument("--group-update", action="store_true",
                        help="time one group's update, batched against one agent at a time, instead of profiling")
    parser.add_argument("--agents", type=int, nargs="+", default=[3, 6, 10], help="--group-update: simple_spread's N")
    parser.add_argument("--rounds", type=int, default=7, help="--group-update: rounds of each path (median is reported)")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[Any, float]:
    """Profile the run, print the table and the top lines; return the seconds of each part (``--group-update``: the
    ratio batched / reference for each N)."""
    args = parse_args(argv)
    common.set_torch_threads(1)
    if args.group_update:
        return group_update(args)
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


def collected_model(n_agents: int, n_envs: int, seed: int) -> tuple[IPPO, UpdateJob]:
    """An untrained model (without its env) and the trajectories of its first update, collected by its policies."""
    env = common.make_ippo_env("simple_spread_v3", n_envs, seed, common.env_kwargs("simple_spread_v3", n_agents))
    model = IPPO("MlpPolicy", env, n_epochs=N_EPOCHS, seed=seed, device="cpu", policy_kwargs={"net_arch": common.NET_ARCH})
    untrained = copy.deepcopy({"policies": model._policies, "return_normalizers": model.return_normalizers})
    total, callback = model._setup_learn(10**9, None)
    model._last_alive = env.alive
    model.collect_rollouts(env, callback, total)
    job = model._prepare_update()
    model._policies, model.return_normalizers = untrained["policies"], untrained["return_normalizers"]
    model.env = None
    env.close()
    return model, job


def timed_update(model: IPPO, job: UpdateJob, batched: bool) -> tuple[float, list[int]]:
    """Seconds of one update of a fresh copy of ``model`` on ``job``'s trajectories, and the passes each agent ran."""
    fresh = copy.deepcopy(model)
    fresh.batched = batched
    fresh._setup_model()
    fresh.set_parameters({"_policies": model._policies.state_dict()}, exact_match=False)
    fresh.set_logger(configure(None, [""]))
    fresh_job = fresh._prepare_update()
    fresh_job.trajectories = job.trajectories
    trainer = fresh._trainer
    start = time.perf_counter()
    stats = trainer.update(fresh_job)
    seconds = time.perf_counter() - start
    return seconds, [stats[agent].n_epochs_run for agent in fresh.possible_agents]


def group_update(args: argparse.Namespace) -> dict[int, float]:
    """``--group-update``: prints the table; returns the ratio batched / reference for each N."""
    print(common.machine_description())
    print(f"simple_spread_v3, one update of one group of N agents on the same trajectories ({args.n_envs} copies, n_epochs "
          f"{N_EPOCHS}, target_kl 0.02, 64x64); {args.rounds} rounds per path, alternating; median seconds")
    print(f"{'N':>3}{'transitions/agent':>19}{'passes run':>12}{'reference s':>13}{'batched s':>11}{'ratio':>8}")
    ratios = {}
    for n_agents in args.agents:
        model, job = collected_model(n_agents, args.n_envs, args.seed)
        seconds: dict[bool, list[float]] = {False: [], True: []}
        passes: dict[bool, list[int]] = {}
        for round_index in range(args.rounds):
            for batched in (False, True) if round_index % 2 == 0 else (True, False):
                elapsed, passes[batched] = timed_update(model, job, batched)
                seconds[batched].append(elapsed)
        assert passes[True] == passes[False], f"the two paths ran different passes: {passes}"
        reference, batched_median = statistics.median(seconds[False]), statistics.median(seconds[True])
        ratios[n_agents] = batched_median / reference
        transitions = sum(len(t) for t in job.trajectories[model.possible_agents[0]])
        print(f"{n_agents:>3}{transitions:>19}{statistics.mean(passes[True]):>12.1f}{reference:>13.3f}"
              f"{batched_median:>11.3f}{ratios[n_agents]:>8.2f}", flush=True)
    return ratios


if __name__ == "__main__":
    main()
