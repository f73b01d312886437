"""The update of one group of N agents, batched (``batched=True``: stacked networks, one forward/backward/Adam step
per minibatch for the group) against the one-agent-at-a-time reference path (``batched=False``), on mpe2
``simple_spread_v3`` with N = 3, 6, 10 agents.

For each N: one model with n_episodes 8, n_epochs 80 (the defaults before issue 22; the default is now 20),
target_kl 0.02, whole-batch minibatches, normalized returns and 64x64 networks collects one update's worth of
trajectories from 8 env copies. Then, round after round, fresh copies of the untrained model update on exactly those
trajectories in this process, the two paths taking turns (A B A B ...). Both paths give the same parameters and run
the same passes (``tests/test_groups.py``), so the times compare equal work. Reported: the median seconds of one
update and the ratio batched / reference.

    python benchmarks/group_update.py [--agents 3 6 10] [--rounds 7] [--n-envs 8]
"""

from __future__ import annotations

import argparse
import copy
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
from stable_baselines3.common.logger import configure

from sb3_ippo import IPPO
from sb3_ippo.update.trainer import UpdateJob

ENV_NAME = "simple_spread_v3"
# Up to 80 passes per update, as in the documented measurements (docs/benchmarks.md): the defaults before issue 22.
N_EPOCHS = 80


def collected_model(n_agents: int, n_envs: int, seed: int) -> tuple[IPPO, UpdateJob]:
    """An untrained model (without its env) and the trajectories of its first update, collected by its policies."""
    env = common.make_ippo_env(ENV_NAME, n_envs, seed, common.env_kwargs(ENV_NAME, n_agents))
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


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", type=int, nargs="+", default=[3, 6, 10], help="values of simple_spread's N")
    parser.add_argument("--rounds", type=int, default=7, help="rounds of each path (median is reported)")
    parser.add_argument("--n-envs", type=int, default=8, help="env copies collecting the batch")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[int, float]:
    """Run the benchmark, print the table, and return the ratio batched / reference for each N."""
    args = parse_args(argv)
    common.set_torch_threads(1)
    print(common.machine_description())
    print(f"{ENV_NAME}, one update of one group of N agents on the same trajectories ({args.n_envs} copies, n_epochs "
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
