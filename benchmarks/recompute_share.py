"""The cost of fresh recomputation (fresh-value GAE and fresh log-probs) as a share of one agent's update.

One agent's batch of ``--trajectories`` x ``--steps`` transitions (default 64 x 64 = 4,096), simple_spread-sized:
18-dimensional observations, Discrete(5) actions, SB3's default ``ActorCriticPolicy`` networks (64x64 for the policy
and for the value function). Every trajectory is truncated, so each also needs a bootstrap value (the worst case).

The update is what ``IPPO.train`` does for one agent: ``build_batch`` then ``ppo_update``. The recomputation is
the part of ``build_batch`` that exists because of ``recompute_values``/``recompute_log_prob``: the batched forward
pass that recomputes V(s) and log pi(a|s), plus the bootstrap V(s_T) forward pass. It is timed in place, inside
``build_batch``, by wrapping those two calls.

Two variants side by side, with IPPO's update defaults otherwise (batch_size None, learning rate 3e-4) and
``--n-epochs`` 80 (the default before issue 22; the default is now 20): ``target_kl=None`` (every pass runs: the
longest update) and ``target_kl=0.01`` (the default when this benchmark was written; it is now 0.02), where the KL
early stop may end the update after a few passes (the shortest update, so the largest share). Each round starts
both from the same initial weights, in alternating order; the figures are medians over ``--rounds`` rounds.

    python benchmarks/recompute_share.py [--rounds 5] [--trajectories 64] [--steps 64] [--n-epochs 80] [--threads N]

Target (issue 3): the recomputation is under 10% of the update.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.policies import ActorCriticPolicy

from sb3_ippo.update import batch as batch_module
from sb3_ippo.buffer import Trajectory
from sb3_ippo.ippo.ippo import default_update_settings
from sb3_ippo.update.batch import build_batch
from sb3_ippo.update.ppo import ppo_update

OBS_DIM, N_ACTIONS = 18, 5
GAMMA, GAE_LAMBDA = 0.99, 0.97
VARIANTS: dict[str, float | None] = {"target_kl=None": None, "target_kl=0.01": 0.01}


def make_trajectories(policy: ActorCriticPolicy, n_trajectories: int, length: int, seed: int) -> list[Trajectory]:
    """Truncated trajectories of random observations, with actions, values and log-probs sampled by ``policy``."""
    rng = np.random.default_rng(seed)
    trajectories = []
    for _ in range(n_trajectories):
        observations = rng.normal(size=(length, OBS_DIM)).astype(np.float32)
        with th.no_grad():
            actions, values, log_probs = policy(th.as_tensor(observations))
        trajectories.append(
            Trajectory(
                observations=observations,
                actions=actions.numpy(),
                rewards=rng.normal(size=length).astype(np.float32),
                values=values.flatten().numpy(),
                log_probs=log_probs.numpy(),
                terminated=False,
                bootstrap_obs=rng.normal(size=OBS_DIM).astype(np.float32),
                policy_version=0,
            )
        )
    return trajectories


class Stopwatch:
    """Accumulates the time spent inside the calls it wraps."""

    def __init__(self) -> None:
        self.seconds = 0.0

    def wrap(self, function: Callable[..., Any]) -> Callable[..., Any]:
        def timed(*args: Any, **kwargs: Any) -> Any:
            start = time.perf_counter()
            try:
                return function(*args, **kwargs)
            finally:
                self.seconds += time.perf_counter() - start

        return timed


@contextmanager
def timing_recomputation(policy: ActorCriticPolicy, stopwatch: Stopwatch) -> Iterator[None]:
    """Time build_batch's recomputation: ``recompute`` (V and log pi of the batch) and the bootstrap V(s_T)."""
    recompute = batch_module.recompute
    batch_module.recompute = stopwatch.wrap(recompute)  # type: ignore[assignment]
    policy.predict_values = stopwatch.wrap(policy.predict_values)  # type: ignore[method-assign]
    try:
        yield
    finally:
        batch_module.recompute = recompute
        del policy.predict_values


def timed_update(policy: ActorCriticPolicy, trajectories: list[Trajectory], n_epochs: int, target_kl: float | None) -> dict:
    """One agent's update, as IPPO.train runs it; the seconds of each part and the passes run."""
    stopwatch = Stopwatch()
    start = time.perf_counter()
    with timing_recomputation(policy, stopwatch):
        batch = build_batch(policy, trajectories, default_update_settings(gamma=GAMMA, gae_lambda=GAE_LAMBDA))
    built = time.perf_counter()
    stats = ppo_update(policy, batch, default_update_settings(n_epochs=n_epochs, target_kl=target_kl))
    end = time.perf_counter()
    return {
        "recompute": stopwatch.seconds,
        "build_batch": built - start,
        "ppo_update": end - built,
        "update": end - start,
        "epochs": stats.n_epochs_run,
    }


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of both variants (medians are reported)")
    parser.add_argument("--trajectories", type=int, default=64, help="trajectories in the batch")
    parser.add_argument("--steps", type=int, default=64, help="steps per trajectory")
    parser.add_argument("--n-epochs", type=int, default=80, help="PPO passes (80: IPPO's default before issue 22)")
    parser.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's own choice)")
    parser.add_argument("--seed", type=int, default=0)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[str, dict[str, float]]:
    """Run the benchmark, print the table, and return each variant's medians (seconds, epochs) and share."""
    args = parse_args(argv)
    if args.threads is not None:
        th.set_num_threads(args.threads)
    th.manual_seed(args.seed)
    initial = ActorCriticPolicy(
        spaces.Box(-np.inf, np.inf, (OBS_DIM,), np.float32), spaces.Discrete(N_ACTIONS), lambda _: 3e-4
    )
    trajectories = make_trajectories(initial, args.trajectories, args.steps, args.seed)

    timed_update(copy.deepcopy(initial), trajectories, min(args.n_epochs, 2), None)  # warm-up
    runs: dict[str, list[dict]] = {name: [] for name in VARIANTS}
    names = list(VARIANTS)
    for round_idx in range(args.rounds):
        for name in names[round_idx % 2 :] + names[: round_idx % 2]:
            runs[name].append(timed_update(copy.deepcopy(initial), trajectories, args.n_epochs, VARIANTS[name]))

    n_transitions = args.trajectories * args.steps
    print(
        f"{n_transitions:,} transitions ({args.trajectories} truncated trajectories x {args.steps} steps), obs {OBS_DIM}, "
        f"Discrete({N_ACTIONS}), 64x64 MLPs, n_epochs {args.n_epochs}, batch_size None; "
        f"{args.rounds} rounds, torch {th.__version__} on {th.get_num_threads()} threads"
    )
    header = ["variant", "recompute ms", "build_batch ms", "ppo_update ms", "update ms", "epochs run", "share"]
    print(f"{header[0]:<16}" + "".join(f"{column:>16}" for column in header[1:]))
    results: dict[str, dict[str, float]] = {}
    for name in names:
        medians = {key: statistics.median(run[key] for run in runs[name]) for key in runs[name][0]}
        medians["share"] = medians["recompute"] / medians["update"]
        results[name] = medians
        print(
            f"{name:<16}"
            + "".join(f"{1000 * medians[key]:>16.2f}" for key in ("recompute", "build_batch", "ppo_update", "update"))
            + f"{medians['epochs']:>16.0f}{medians['share']:>15.1%}"
        )
    print("share = median recompute time / median update time (build_batch + ppo_update); target: under 10%")
    # The share grows as the KL early stop shortens the update: say from how many passes it stays under 10%.
    # ppo_update ~ 2 whole-batch loss evaluations (before and after, each ~ the recompute) + one pass per epoch.
    full = results["target_kl=None"]
    recompute, fixed = full["recompute"], full["build_batch"] + 2 * full["recompute"]
    per_epoch = max(full["ppo_update"] - 2 * recompute, 0.0) / max(full["epochs"], 1)
    break_even = max(0, int(np.floor((10 * recompute - fixed) / per_epoch)) + 1) if per_epoch > 0 else 0
    print(
        f"one PPO pass over the batch: {1000 * per_epoch:.2f} ms = {per_epoch / recompute:.1f}x the recompute; "
        f"the share stays under 10% when the update runs at least {break_even} of {args.n_epochs} passes"
    )
    return results


if __name__ == "__main__":
    main()
