"""Agent-steps per second of the multi-agent vectorized env, against a plain Python loop over raw envs.

Steps ``--n-envs`` copies of mpe2 ``simple_spread_v3`` (N=3, max_cycles=25) with random actions three ways:
through ``make_vec_env(..., vec_env_cls="dummy")``, through ``vec_env_cls="subproc"``, and through a plain loop
over raw parallel envs that resets each env at the end of its episode. The variants take turns, in a rotating
order, for ``--rounds`` rounds of ``--steps`` vectorized steps each; the figure of each variant is its median
over the rounds. All variants read their actions from one pre-generated array, so the figures compare the env
layers, not the ways of drawing actions. The plain loop gets that array as Python ints (converted before its
clock starts): mpe2 steps about 30% slower on numpy integer actions, which would flatter the layer.

    python benchmarks/env_throughput.py [--rounds 5] [--steps 2000] [--n-envs 8] [--padded-ms 1.0] [--padded-steps 200]

Targets (issue 2): dummy >= 0.7x the plain loop, subproc > 1.0x (on 2 cores).

A second table (``--padded-ms``, 0 to skip) steps copies of the same env padded to cost about that many milliseconds
of CPU per step (a busy wait, like a physics engine, not a sleep) through "dummy", "subproc" and "ray" (Ray actors on
a local Ray instance started for it), and states Ray's overhead per vectorized step against "subproc" (issue 10).

``--batched`` measures instead env steps per second of IPPO's ``learn``, at its defaults, on a natively batched env
against the same env unbatched into PettingZoo copies (issue 34): the chase game of ``tests/batched_envs.py``,
torch-batched (``make_vec_env(TorchChaseEnv, n, vec_env_cls="batched")``) and as
``make_vec_env(ChaseParallelEnv, n)``, at ``--batched-copies`` copies (8, 64, 512). The two take turns, in alternating
order, for ``--rounds`` rounds of ``--batched-steps`` vectorized steps each (one ``learn`` call of ``steps * n`` env
steps, after a warm-up round); the figure of each is its median.

    python benchmarks/env_throughput.py --batched [--rounds 5] [--batched-steps 60] [--batched-copies 8,64,512]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from functools import partial
from typing import Any

import numpy as np
from gymnasium import spaces
from mpe2 import simple_spread_v3
from pettingzoo import ParallelEnv

from sb3_ippo import make_vec_env
from sb3_ippo.vec_env import MultiAgentVecEnv

ENV_KWARGS = {"N": 3, "max_cycles": 25}


def make_env() -> ParallelEnv:
    return simple_spread_v3.parallel_env(**ENV_KWARGS)


def make_padded_env(step_ms: float) -> ParallelEnv:
    """simple_spread whose every step first busy-waits ``step_ms`` milliseconds of CPU (an expensive env's cost)."""
    env = make_env()
    step = env.step

    def padded_step(actions: dict[str, Any]) -> Any:
        deadline = time.perf_counter() + step_ms / 1000
        while time.perf_counter() < deadline:
            pass
        return step(actions)

    env.step = padded_step  # type: ignore[method-assign]
    return env


def _pickle_this_module_by_value() -> None:
    """Worker processes and Ray actors cannot import this file: let cloudpickle send :func:`make_padded_env` by value
    (it does so by itself for ``__main__`` and for a module loaded by path, which is not in ``sys.modules``)."""
    module = sys.modules.get(__name__)
    if __name__ == "__main__" or module is None:
        return
    import cloudpickle
    import ray.cloudpickle

    cloudpickle.register_pickle_by_value(module)
    ray.cloudpickle.register_pickle_by_value(module)


def run_plain(envs: list[ParallelEnv], actions: list[list[list[int]]], agent_index: dict[str, int]) -> int:
    """Step raw parallel envs one after the other, each resetting itself at episode end; return the agent-steps."""
    agent_steps = 0
    for step_actions in actions:
        for env, env_actions in zip(envs, step_actions, strict=True):
            agent_steps += len(env.agents)
            env.step({agent: env_actions[agent_index[agent]] for agent in env.agents})
            if not env.agents:
                env.reset()
    return agent_steps


def run_layer(vec_env: MultiAgentVecEnv, actions: np.ndarray, agent_index: dict[str, int]) -> int:
    """Step the vectorized env (it resets its copies itself); return the agent-steps."""
    agent_steps = 0
    alive = vec_env.alive
    for t in range(len(actions)):
        agent_steps += sum(int(mask.sum()) for mask in alive.values())
        alive = vec_env.step_agents({agent: actions[t, :, j] for agent, j in agent_index.items()}).alive
    return agent_steps


def measure(run: Callable[[Any], int], actions: Any) -> float:
    start = time.perf_counter()
    agent_steps = run(actions)
    return agent_steps / (time.perf_counter() - start)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of every variant (median is reported)")
    parser.add_argument("--steps", type=int, default=2000, help="vectorized steps per round and variant")
    parser.add_argument("--n-envs", type=int, default=8, help="env copies")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--padded-ms", type=float, default=1.0, help="CPU cost of a padded env step (0: no padded table)")
    parser.add_argument("--padded-steps", type=int, default=200, help="vectorized steps per round, padded env")
    parser.add_argument("--batched", action="store_true", help="IPPO's learn on a batched env against PettingZoo copies")
    parser.add_argument("--batched-steps", type=int, default=60, help="vectorized steps per round, --batched")
    parser.add_argument(
        "--batched-copies", type=lambda text: [int(n) for n in text.split(",")], default=[8, 64, 512], help="e.g. 8,64,512"
    )
    return parser.parse_args(argv)


def batched_table(args: argparse.Namespace) -> dict[str, float]:
    """Env steps/s of IPPO's learn on the batched chase game and on its PettingZoo copies, rounds alternating."""
    from sb3_ippo import IPPO

    sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # the checkout's tests/
    from tests.batched_envs import ChaseParallelEnv, TorchChaseEnv

    load_before = os.getloadavg()[0]
    medians: dict[str, float] = {}
    rng = np.random.default_rng(args.seed)
    for n_envs in args.batched_copies:
        makers = {
            "batched": partial(make_vec_env, TorchChaseEnv, n_envs, seed=args.seed, vec_env_cls="batched"),
            "pettingzoo": partial(make_vec_env, ChaseParallelEnv, n_envs, seed=args.seed),
        }
        models = {name: IPPO("MlpPolicy", make()) for name, make in makers.items()}
        # The env layer alone, for where the time goes: the same env stepped with random actions, no policy.
        layers = {name: make() for name, make in makers.items()}
        agent_index = {agent: j for j, agent in enumerate(layers["batched"].possible_agents)}
        rates: dict[str, list[float]] = {f"{name}{part}": [] for name in models for part in ("", "_layer")}
        names = list(models)
        for layer in layers.values():
            layer.reset()
        for round_idx in range(args.rounds + 1):  # round 0 warms up
            actions = rng.integers(0, 3, size=(args.batched_steps, n_envs, len(agent_index)))
            for name in names[round_idx % 2 :] + names[: round_idx % 2]:
                start = time.perf_counter()
                model = models[name].learn(args.batched_steps * n_envs)
                learn_rate = model.num_timesteps / (time.perf_counter() - start)
                start = time.perf_counter()
                for t in range(len(actions)):
                    layers[name].step_agents({agent: actions[t, :, j] for agent, j in agent_index.items()})
                layer_rate = actions.shape[0] * n_envs / (time.perf_counter() - start)
                if round_idx > 0:
                    rates[name].append(learn_rate)
                    rates[f"{name}_layer"].append(layer_rate)
        for name in names:
            models[name].env.close()
            layers[name].close()
        medians.update({f"{key}_{n_envs}": statistics.median(values) for key, values in rates.items()})
    print(
        f"\nIPPO's learn (defaults) on the chase game of tests/batched_envs.py (3 agents that leave at the target or die off "
        f"the line): {args.rounds} rounds x {args.batched_steps} vectorized steps, alternating; {os.cpu_count()} CPUs "
        f"(load average before: {load_before:.2f}, after: {os.getloadavg()[0]:.2f}). Env steps/s, median:"
    )
    header = f"{'learn: batched':>16}{'PettingZoo':>12}{'ratio':>8}{'env alone: batched':>20}{'PettingZoo':>12}{'ratio':>8}"
    print(f"{'copies':<8}{header}")
    for n_envs in args.batched_copies:
        cells = []
        for suffix in ("", "_layer"):
            batched, pettingzoo = medians[f"batched{suffix}_{n_envs}"], medians[f"pettingzoo{suffix}_{n_envs}"]
            width = 16 if not suffix else 20
            cells.append(f"{batched:>{width},.0f}{pettingzoo:>12,.0f}{batched / pettingzoo:>7.2f}x")
        print(f"{n_envs:<8}{''.join(cells)}")
    return medians


def padded_table(args: argparse.Namespace) -> dict[str, float]:
    """Dummy, subproc and Ray on the padded env: median vectorized steps/s over alternating rounds; Ray's overhead."""
    import ray

    _pickle_this_module_by_value()
    started_ray = not ray.is_initialized()
    if started_ray:
        ray.init(num_cpus=os.cpu_count(), include_dashboard=False, log_to_driver=False)
    load_before = os.getloadavg()[0]
    env_fn = partial(make_padded_env, args.padded_ms)
    vec_envs = {
        name: make_vec_env(env_fn, args.n_envs, seed=args.seed, vec_env_cls=name) for name in ("dummy", "subproc", "ray")
    }
    agents = list(vec_envs["dummy"].possible_agents)
    rng = np.random.default_rng(args.seed)
    rates: dict[str, list[float]] = {name: [] for name in vec_envs}
    try:
        for vec_env in vec_envs.values():
            vec_env.reset()
        for round_idx in range(args.rounds + 1):  # round 0 warms up
            actions = rng.integers(0, 5, size=(args.padded_steps, args.n_envs, len(agents)))
            names = list(vec_envs)
            for name in names[round_idx % 3 :] + names[: round_idx % 3]:
                start = time.perf_counter()
                for t in range(len(actions)):
                    vec_envs[name].step_agents({agent: actions[t, :, j] for j, agent in enumerate(agents)})
                if round_idx > 0:
                    rates[name].append(len(actions) / (time.perf_counter() - start))
    finally:
        for vec_env in vec_envs.values():
            vec_env.close()
        if started_ray:
            ray.shutdown()
    medians = {name: statistics.median(values) for name, values in rates.items()}
    print(
        f"\nsimple_spread padded to ~{args.padded_ms:g} ms of CPU per env step, {args.n_envs} copies: {args.rounds} rounds x "
        f"{args.padded_steps} vectorized steps (load average before: {load_before:.2f}, after: {os.getloadavg()[0]:.2f})"
    )
    print(f"{'variant':<10}{'vec steps/s (median)':>22}{'ms/vec step':>13}{'vs dummy':>10}")
    for name, rate in medians.items():
        print(f"{name:<10}{rate:>22,.1f}{1000 / rate:>13.2f}{rate / medians['dummy']:>9.2f}x")
    overhead = 1000 / medians["ray"] - 1000 / medians["subproc"]
    print(f"Ray overhead per vectorized step against subproc: {overhead:+.2f} ms")
    return {f"padded_{name}": rate for name, rate in medians.items()} | {"ray_overhead_ms": overhead}



def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    """Run the benchmark, print the table, and return the median agent-steps/s of each variant."""
    args = parse_args(argv)
    if args.batched:
        return batched_table(args)
    # Other processes on the machine slow the subprocess variant most: the load says how far to trust the figures.
    load_before = os.getloadavg()[0]
    n_envs = args.n_envs
    envs = [make_env() for _ in range(n_envs)]
    for i, env in enumerate(envs):
        env.reset(seed=args.seed + i)
    agents = list(envs[0].possible_agents)
    agent_index = {agent: j for j, agent in enumerate(agents)}
    action_space = envs[0].action_space(agents[0])
    assert isinstance(action_space, spaces.Discrete)
    n_actions = int(action_space.n)
    rng = np.random.default_rng(args.seed)
    # One block of actions per round, shared by all variants: (steps, n_envs, n_agents).
    action_blocks = [rng.integers(0, n_actions, size=(args.steps, n_envs, len(agents))) for _ in range(args.rounds)]

    vec_envs = {
        name: make_vec_env(simple_spread_v3.parallel_env, n_envs, seed=args.seed, vec_env_cls=name, env_kwargs=ENV_KWARGS)
        for name in ("dummy", "subproc")
    }
    runs: dict[str, Callable[[Any], int]] = {"plain": partial(run_plain, envs, agent_index=agent_index)}
    for name, vec_env in vec_envs.items():
        vec_env.reset()
        runs[name] = partial(run_layer, vec_env, agent_index=agent_index)

    try:
        warm_up = action_blocks[0][: min(50, args.steps)]
        for name, run in runs.items():
            run(warm_up.tolist() if name == "plain" else warm_up)
        rates: dict[str, list[float]] = {name: [] for name in runs}
        names = list(runs)
        for round_idx, actions in enumerate(action_blocks):
            plain_actions = actions.tolist()
            # Rotate the order, so that no variant always runs first (or right after another's clean-up).
            for name in names[round_idx % len(names) :] + names[: round_idx % len(names)]:
                rates[name].append(measure(runs[name], plain_actions if name == "plain" else actions))
    finally:
        for vec_env in vec_envs.values():
            vec_env.close()

    medians = {name: statistics.median(values) for name, values in rates.items()}
    print(
        f"simple_spread_v3 {ENV_KWARGS}, {n_envs} copies, random actions: {args.rounds} rounds x {args.steps} steps, "
        f"{os.cpu_count()} CPUs (load average before: {load_before:.2f}, after: {os.getloadavg()[0]:.2f})"
    )
    print(f"{'variant':<10}{'agent-steps/s (median)':>24}{'min':>12}{'max':>12}{'vs plain':>10}")
    for name in ("plain", "dummy", "subproc"):
        ratio = medians[name] / medians["plain"]
        print(f"{name:<10}{medians[name]:>24,.0f}{min(rates[name]):>12,.0f}{max(rates[name]):>12,.0f}{ratio:>9.2f}x")
    if args.padded_ms > 0:
        return medians | padded_table(args)
    return medians


if __name__ == "__main__":
    main()
