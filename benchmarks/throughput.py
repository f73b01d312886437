"""Training throughput: IPPO against SB3 PPO with SuperSuit parameter sharing, in matched setups.

Both train on mpe2 ``simple_spread_v3`` (N=3, max_cycles=25) with the same work per update:

- the same env copies (``--n-envs``, default 8, in-process) and networks (64x64 policy and value MLPs);
- the same samples per update: the peer collects ``--peer-n-steps`` steps on each of its n_envs x n_agents
  ``VecEnv`` entries; IPPO gets ``n_steps = peer_n_steps x n_envs`` transitions per agent, so both update on
  ``peer_n_steps x n_envs x n_agents`` agent-transitions (default 200 x 8 x 3 = 4,800; 200 is a multiple of the
  25-step episode, so IPPO's whole-episode batches are exactly that size);
- the same ``--n-epochs`` (10) and ``--batch-size`` (256), ``target_kl=None`` for both (a fixed amount of work);
- updates in the training process for both (IPPO: ``async_training=False``, whatever ``--timesteps``).

With ``--defaults``, each library runs its own defaults instead (IPPO: whole-episode batches of n_episodes 8,
n_epochs 20 with target_kl 0.02, batched agent groups, and ``async_training="auto"``: for ``--timesteps`` of at
least 20,000 on a machine with a second CPU core, each update runs in a learner process while collection goes on
(the clock then includes starting and stopping it), otherwise in the training process; the peer: n_steps 2048 per
entry, batch_size 64, n_epochs 10), with 64x64 networks and ``--n-envs`` copies: what a user gets from
``IPPO("MlpPolicy", env)`` and ``PPO("MlpPolicy", env)``. The peer then updates every 2048 x 24 agent-steps, so use
``--timesteps`` of at least 16,384 env steps there.

Each round trains a fresh model of each for ``--timesteps`` env steps; the clock covers ``learn`` only. Rounds
alternate the order (A B, B A, ...), and the figure of each is its median over ``--rounds`` rounds. Throughput is
training agent-steps per second: env steps x agents / wall time, collection and updates together.

    python benchmarks/throughput.py [--rounds 5] [--timesteps 9600] [--n-envs 8] [--n-agents 3] [--skrl]
    python benchmarks/throughput.py --defaults --rounds 3 --timesteps 32768

``--skrl`` adds skrl's IPPO as a third column (same networks, samples per update, epochs, minibatch size and no KL
stop; one env copy, because skrl's PettingZoo wrapper does not vectorize). ``pip install skrl`` (2.1.1) installs
beside torch 2.13 without replacing it.

Every process runs torch on one thread (see ``benchmarks/common.py``).

**Scaling with the number of agents** (``--agents N [N ...]``, formerly ``benchmarks/scaling.py``): the matched setup
above, repeated for each N of simple_spread_v3; the table gives the training cost per agent-step (wall-clock
microseconds per env step x N, collection and updates together) of each algorithm, its growth from the first N, and
the ratio IPPO/peer. Per update, each IPPO agent trains on ``peer_n_steps x n_envs`` of its own transitions; the peer
trains its one network on those of all N agents together, so the gradient steps per update are about the same for
both at every N.

    python benchmarks/throughput.py --agents 3 6 10 --rounds 3 --timesteps 3200

**Speed as a user gets it** (``--as-written``, formerly ``benchmarks/as_written.py``): the README's Python snippet as
written (torch's thread count untouched) against the same snippet after ``torch.set_num_threads(1)`` and against the
command line, each round in fresh processes. Every variant trains IPPO's defaults on mpe2 ``simple_spread_v3`` (N=3,
max_cycles=25) with 8 in-process copies for ``--timesteps`` env steps, seed 0:

- ``as_written``: the README's snippet (``make_vec_env(..., n_envs=8)``, ``IPPO("MlpPolicy", env, verbose=1)``,
  ``learn``), nothing else; stdout to a file, as a terminal would show it;
- ``one_thread``: the same, after ``torch.set_num_threads(1)`` (what every other figure in docs/benchmarks.md sets);
- ``cli``: ``python -m sb3_ippo train --timesteps T --no-progress-bar --eval-episodes 1`` (its ``--threads`` default,
  1); its speed is the last ``time/fps`` of progress.csv, which covers ``learn`` as the others' clocks do.

With ``--before CHECKOUT`` (a checkout of an earlier commit), ``before`` runs the snippet as written on that
checkout's ``sb3_ippo`` (``PYTHONPATH``), in the same alternating rounds. The clock of the snippets covers ``learn``
only (not importing torch, nor building the env). Rounds alternate the order of the variants; each figure is the
median of ``--rounds``. ``--busy N`` starts N other processes that each spin a core for the whole run (the "one other
busy process" of issue 36 is ``--busy 1``).

    python benchmarks/throughput.py --as-written --rounds 2 --timesteps 30000
    python benchmarks/throughput.py --as-written --rounds 2 --timesteps 30000 --busy 1 [--before ../sb3_ippo_a144363]
"""

from __future__ import annotations

import argparse
import csv
import os
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common

import numpy as np

from sb3_ippo import IPPO

ENV_NAME = "simple_spread_v3"


def build_ippo(args: argparse.Namespace, kwargs: dict[str, Any], seed: int) -> Callable[[int], Any]:
    env = common.make_ippo_env(ENV_NAME, args.n_envs, seed, kwargs)
    if args.defaults:
        defaults = IPPO("MlpPolicy", env, policy_kwargs={"net_arch": common.NET_ARCH}, seed=seed, device="cpu")
        return lambda timesteps: defaults.learn(total_timesteps=timesteps)
    model = IPPO(
        "MlpPolicy",
        env,
        n_steps=args.peer_n_steps * args.n_envs,
        batch_size=args.batch_size,
        n_epochs=args.n_epochs,
        target_kl=None,
        async_training=False,  # matched: every update in this process, as the peer's
        policy_kwargs={"net_arch": common.NET_ARCH},
        seed=seed,
        device="cpu",
    )
    return lambda timesteps: model.learn(total_timesteps=timesteps)


def build_peer(args: argparse.Namespace, kwargs: dict[str, Any], seed: int) -> Callable[[int], Any]:
    n_agents = len(common.agent_ids(ENV_NAME, kwargs))
    env = common.make_peer_env(ENV_NAME, args.n_envs, seed, kwargs)
    if args.defaults:
        defaults = common.make_peer(env, seed)
        return lambda timesteps: defaults.learn(total_timesteps=timesteps * n_agents)
    model = common.make_peer(
        env, seed, n_steps=args.peer_n_steps, batch_size=args.batch_size, n_epochs=args.n_epochs, target_kl=None
    )
    return lambda timesteps: model.learn(total_timesteps=timesteps * n_agents)


def build_skrl(args: argparse.Namespace, kwargs: dict[str, Any], seed: int) -> Callable[[int], Any]:
    """skrl's IPPO with the same networks, samples per update, epochs and minibatch size, KL stop off.

    skrl's PettingZoo wrapper steps one env copy (it has no vectorization for PettingZoo envs), so skrl runs 1 copy
    for ``rollouts = peer_n_steps x n_envs`` steps per update: the same samples per agent per update as the others.
    """
    learner = SkrlIPPO(
        common.env_fn(ENV_NAME)(**kwargs), seed, rollouts=args.peer_n_steps * args.n_envs, n_epochs=args.n_epochs,
        batch_size=args.batch_size, learning_rate=3e-4,
    )
    return learner.learn


class SkrlIPPO:
    """skrl's IPPO (``skrl.multi_agents.torch.ippo``) on one copy of a PettingZoo parallel env, 64x64 MLPs per agent.

    Discrete actions get a categorical policy, Box actions a Gaussian one (state-independent log std). skrl flattens
    every observation, so image observations go through the MLP flat. ``policy_networks`` maps each agent to its
    policy, for acting outside skrl (``act``). ``rollouts`` steps per update, ``n_epochs`` passes in minibatches of
    about ``batch_size``, no KL stop.
    """

    def __init__(self, env: Any, seed: int, rollouts: int, n_epochs: int, batch_size: int, learning_rate: float) -> None:
        import dataclasses

        import gymnasium
        import torch as th
        import torch.nn as nn
        from skrl import logger as skrl_logger
        from skrl.envs.wrappers.torch import wrap_env
        from skrl.memories.torch import RandomMemory
        from skrl.models.torch import CategoricalMixin, DeterministicMixin, GaussianMixin, Model
        from skrl.multi_agents.torch.ippo import IPPO, IPPO_CFG
        from skrl.utils import set_seed

        # skrl's info messages ("Environment closed", ...) add nothing to the table, and its handler holds the stdout
        # of the moment of import, which pytest closes before skrl's last message.
        skrl_logger.setLevel("WARNING")

        def mlp(n_in: int, n_out: int) -> nn.Module:
            return nn.Sequential(nn.Linear(n_in, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, n_out))

        class CategoricalPolicy(CategoricalMixin, Model):
            def __init__(self, observation_space: Any, action_space: Any) -> None:
                Model.__init__(self, observation_space=observation_space, action_space=action_space, device="cpu")
                CategoricalMixin.__init__(self, unnormalized_log_prob=True)
                self.net = mlp(self.num_observations, self.num_actions)

            def compute(self, inputs: dict, role: str = "") -> tuple:  # type: ignore[override]
                return self.net(inputs["observations"]), {}

        class GaussianPolicy(GaussianMixin, Model):
            def __init__(self, observation_space: Any, action_space: Any) -> None:
                Model.__init__(self, observation_space=observation_space, action_space=action_space, device="cpu")
                GaussianMixin.__init__(self, clip_actions=True)
                self.net = mlp(self.num_observations, self.num_actions)
                self.log_std = nn.Parameter(th.zeros(self.num_actions))

            def compute(self, inputs: dict, role: str = "") -> tuple:  # type: ignore[override]
                return self.net(inputs["observations"]), {"log_std": self.log_std}

        class Value(DeterministicMixin, Model):
            def __init__(self, observation_space: Any, action_space: Any) -> None:
                Model.__init__(self, observation_space=observation_space, action_space=action_space, device="cpu")
                DeterministicMixin.__init__(self)
                self.net = mlp(self.num_observations, 1)

            def compute(self, inputs: dict, role: str = "") -> tuple:  # type: ignore[override]
                return self.net(inputs["observations"]), {}

        set_seed(seed)
        self.env = wrap_env(env, wrapper="pettingzoo")
        agents = self.env.possible_agents
        models = {}
        for agent in agents:
            observation_space, action_space = self.env.observation_space(agent), self.env.action_space(agent)
            policy = CategoricalPolicy if isinstance(action_space, gymnasium.spaces.Discrete) else GaussianPolicy
            models[agent] = {
                "policy": policy(observation_space, action_space), "value": Value(observation_space, action_space)
            }
        self.policy_networks = {agent: models[agent]["policy"] for agent in agents}
        memories = {
            agent: RandomMemory(memory_size=rollouts, num_envs=self.env.num_envs, device="cpu") for agent in agents
        }
        cfg = IPPO_CFG(
            rollouts=rollouts, learning_epochs=n_epochs, mini_batches=max(rollouts // batch_size, 1),
            learning_rate=learning_rate, kl_threshold=0.0,
        )
        # skrl 2.1.1's IPPO_CFG rejects its own empty-dict defaults ("Specified keys (set()) do not match possible
        # agents"): give every such field one empty dict per agent.
        for field in dataclasses.fields(cfg):
            if getattr(cfg, field.name) == {}:
                setattr(cfg, field.name, {agent: {} for agent in agents})
        self.agent = IPPO(
            possible_agents=agents, models=models, memories=memories, observation_spaces=self.env.observation_spaces,
            action_spaces=self.env.action_spaces, state_spaces=self.env.state_spaces, device="cpu", cfg=cfg,
        )

    def learn(self, timesteps: int) -> None:
        """Train for ``timesteps`` steps of the one env copy."""
        from skrl.trainers.torch import SequentialTrainer

        trainer_cfg = {"timesteps": timesteps, "headless": True, "disable_progressbar": True}
        SequentialTrainer(env=self.env, agents=self.agent, cfg=trainer_cfg).train()

    def act(self, agent: str, observation: Any, deterministic: bool) -> Any:
        """One agent's action for its raw (PettingZoo) observation: the most likely or mean action if deterministic."""
        import gymnasium
        import torch as th

        policy = self.policy_networks[agent]
        space = self.env.action_space(agent)
        flat = th.as_tensor(gymnasium.spaces.flatten(self.env.observation_space(agent), observation), dtype=th.float32)
        with th.no_grad():
            output, _ = policy.compute({"observations": flat[None]})
            if isinstance(space, gymnasium.spaces.Discrete):
                logits = output[0]
                return int(logits.argmax()) if deterministic else int(th.distributions.Categorical(logits=logits).sample())
            action = output[0] if deterministic else policy.act({"observations": flat[None]})[0][0]
        return np.clip(action.numpy(), space.low, space.high)


BUILDERS: dict[str, Callable[[argparse.Namespace, dict[str, Any], int], Callable[[int], Any]]] = {
    "ippo": build_ippo,
    "peer": build_peer,
}
OPTIONAL_BUILDERS = {"skrl": build_skrl}


def measure(build: Callable[..., Callable[[int], Any]], args: argparse.Namespace, kwargs: dict, seed: int) -> float:
    """Seconds of one ``learn`` of ``args.timesteps`` env steps by a fresh model (building it is not timed)."""
    learn = build(args, kwargs, seed)
    start = time.perf_counter()
    learn(args.timesteps)
    return time.perf_counter() - start


def compare(args: argparse.Namespace, kwargs: dict[str, Any], names: Sequence[str]) -> dict[str, list[float]]:
    """Alternate the variants for ``args.rounds`` rounds (after one short warm-up each); agent-steps/s per round."""
    n_agents = len(common.agent_ids(ENV_NAME, kwargs))
    # One episode per copy: enough to warm the collection path (the peer also runs one update, as SB3 always does).
    warm_up = argparse.Namespace(**{**vars(args), "timesteps": kwargs["max_cycles"] * args.n_envs})
    builders = {**BUILDERS, **OPTIONAL_BUILDERS}
    with warnings.catch_warnings():
        # The warm-up is shorter than an update on purpose: IPPO's warning that it made none is expected.
        warnings.simplefilter("ignore")
        for name in names:
            measure(builders[name], warm_up, kwargs, args.seed)
    rates: dict[str, list[float]] = {name: [] for name in names}
    for round_idx in range(args.rounds):
        # Rotate the order, so that no algorithm always runs first (two algorithms: A B, B A, ...).
        order = list(names[round_idx % len(names) :]) + list(names[: round_idx % len(names)])
        if len(names) == 2 and round_idx % 2:
            order = list(reversed(names))
        for name in order:
            seconds = measure(builders[name], args, kwargs, args.seed + round_idx)
            rates[name].append(args.timesteps * n_agents / seconds)
    return rates


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=5, help="rounds of each algorithm (median is reported)")
    parser.add_argument("--timesteps", type=int, default=9600, help="env steps per round (default: 6 updates)")
    parser.add_argument("--n-envs", type=int, default=8, help="env copies")
    parser.add_argument("--n-agents", type=int, default=3, help="simple_spread's N")
    parser.add_argument("--peer-n-steps", type=int, default=200, help="the peer's n_steps per VecEnv entry")
    parser.add_argument("--batch-size", type=int, default=256, help="minibatch size of both")
    parser.add_argument("--n-epochs", type=int, default=10, help="passes per update of both")
    parser.add_argument("--skrl", action="store_true", help="add skrl's IPPO as a third column (pip install skrl)")
    parser.add_argument("--defaults", action="store_true", help="each library's own defaults instead of matched work")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--agents", type=int, nargs="+", default=None,
                        help="scaling: the matched setup for each of these values of simple_spread's N")
    parser.add_argument("--as-written", action="store_true",
                        help="the README's snippet as written against one thread and the command line, in fresh processes")
    parser.add_argument("--busy", type=int, default=0, help="--as-written: other processes that each spin a core meanwhile")
    parser.add_argument("--before", type=Path, default=None,
                        help="--as-written: a checkout of an earlier commit: adds 'before'")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> dict[Any, Any]:
    """Run the benchmark, print the table, and return the median agent-steps/s of each algorithm (``--agents``: the
    median microseconds per agent-step, per N and algorithm; ``--as-written``: the median env steps/s of each
    variant)."""
    args = parse_args(argv)
    if args.as_written:
        return as_written(args)
    common.set_torch_threads(1)
    if args.agents is not None:
        return scaling(args)
    kwargs = common.env_kwargs(ENV_NAME, args.n_agents)
    names = list(BUILDERS) + (["skrl"] if args.skrl else [])
    rates = compare(args, kwargs, names)
    medians = {name: statistics.median(values) for name, values in rates.items()}
    samples = args.peer_n_steps * args.n_envs * args.n_agents
    print(common.machine_description())
    if args.defaults:
        print(f"{ENV_NAME} {kwargs}, {args.n_envs} copies, 64x64 MLPs, each library's defaults; {args.rounds} rounds x "
              f"{args.timesteps:,} env steps, alternating")
    else:
        print(
        f"{ENV_NAME} {kwargs}, {args.n_envs} copies, 64x64 MLPs, {samples:,} agent-transitions per update "
        f"(IPPO n_steps {args.peer_n_steps * args.n_envs} per agent; peer n_steps {args.peer_n_steps} x "
        f"{args.n_envs * args.n_agents} entries), n_epochs {args.n_epochs}, batch_size {args.batch_size}, target_kl None; "
        f"{args.rounds} rounds x {args.timesteps:,} env steps, alternating"
        )
    print(f"{'algorithm':<10}{'agent-steps/s (median)':>24}{'env steps/s':>13}{'min':>10}{'max':>10}{'rounds':>40}")
    for name, values in rates.items():
        rounds = " ".join(f"{value:,.0f}" for value in values)
        env_steps = medians[name] / args.n_agents
        print(f"{name:<10}{medians[name]:>24,.0f}{env_steps:>13,.0f}{min(values):>10,.0f}{max(values):>10,.0f}{rounds:>40}")
    medians["ratio"] = medians["ippo"] / medians["peer"]
    print(f"ratio IPPO/peer (medians): {medians['ratio']:.2f}")
    if "skrl" in medians:
        medians["ratio_skrl"] = medians["ippo"] / medians["skrl"]
        print(f"ratio IPPO/skrl (medians): {medians['ratio_skrl']:.2f} (skrl: 1 env copy, no PettingZoo vectorization)")
    return medians


def scaling(args: argparse.Namespace) -> dict[int, dict[str, float]]:
    """``--agents``: the matched setup for each N; prints the table, returns the median microseconds per agent-step."""
    costs: dict[int, dict[str, float]] = {}
    for n_agents in args.agents:
        kwargs = common.env_kwargs(ENV_NAME, n_agents)
        rates = compare(args, kwargs, list(BUILDERS))
        costs[n_agents] = {name: 1e6 / statistics.median(values) for name, values in rates.items()}
        print(f"N={n_agents}: " + ", ".join(f"{name} {cost:,.0f} us/agent-step" for name, cost in costs[n_agents].items()),
              flush=True)
    print(common.machine_description())
    setup = (
        "each library's defaults"
        if args.defaults
        else f"n_epochs {args.n_epochs}, batch_size {args.batch_size}, {args.peer_n_steps * args.n_envs} transitions per "
        "agent per update, target_kl None"
    )
    print(f"simple_spread_v3 (max_cycles 25), {args.n_envs} copies, 64x64 MLPs, {setup}; {args.rounds} rounds x "
          f"{args.timesteps:,} env steps per N, alternating")
    first = costs[args.agents[0]]
    print(f"{'N':>4}{'IPPO us/agent-step':>20}{'x N=' + str(args.agents[0]):>8}{'peer us/agent-step':>20}"
          f"{'x N=' + str(args.agents[0]):>8}{'IPPO/peer':>11}")
    for n_agents, cost in costs.items():
        print(
            f"{n_agents:>4}{cost['ippo']:>20,.0f}{cost['ippo'] / first['ippo']:>8.2f}{cost['peer']:>20,.0f}"
            f"{cost['peer'] / first['peer']:>8.2f}{cost['ippo'] / cost['peer']:>11.2f}"
        )
    return costs


SNIPPET = """
import time
{threads}
from mpe2 import simple_spread_v3
from sb3_ippo import IPPO, make_vec_env

env = make_vec_env(simple_spread_v3.parallel_env, n_envs=8, seed=0, env_kwargs=dict(N=3, max_cycles=25))
model = IPPO("MlpPolicy", env, verbose=1, seed=0)
start = time.perf_counter()
model.learn(total_timesteps={timesteps})
print("RATE", {timesteps} / (time.perf_counter() - start))
"""
AS_WRITTEN_VARIANTS = ("as_written", "one_thread", "cli")
BUSY_LOOP = "while True: pass"


def run_snippet(timesteps: int, one_thread: bool, out: Path, checkout: Path | None = None) -> float:
    threads = "import torch; torch.set_num_threads(1)" if one_thread else ""
    code = SNIPPET.format(threads=threads, timesteps=timesteps) + "import sb3_ippo; print('FROM', sb3_ippo.__file__)\n"
    env = dict(os.environ, PYTHONPATH=str(checkout.resolve())) if checkout is not None else None
    with open(out, "w") as stdout:
        # In the output's folder: python -c puts its working folder first on sys.path, before PYTHONPATH.
        subprocess.run([sys.executable, "-c", code], stdout=stdout, stderr=subprocess.STDOUT, check=True, env=env,
                       cwd=out.parent)
    lines = [line for line in out.read_text().splitlines() if line.startswith("RATE ")]
    return float(lines[-1].split()[1])


def run_cli(timesteps: int, folder: Path) -> float:
    command = [sys.executable, "-m", "sb3_ippo", "train", "--timesteps", str(timesteps), "--no-progress-bar",
               "--eval-episodes", "1", "--seed", "0", "--out", str(folder), "--overwrite"]
    subprocess.run(command, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, check=True)
    with open(folder / "progress.csv") as file:
        rows = [row for row in csv.DictReader(file) if row.get("time/fps")]
    return float(rows[-1]["time/fps"])


def as_written(args: argparse.Namespace) -> dict[str, float]:
    """``--as-written``: the README's snippet in fresh processes; prints the table, returns each variant's median."""
    variants = (*AS_WRITTEN_VARIANTS, "before") if args.before is not None else AS_WRITTEN_VARIANTS
    busy = [subprocess.Popen([sys.executable, "-c", BUSY_LOOP]) for _ in range(args.busy)]
    rates: dict[str, list[float]] = {variant: [] for variant in variants}
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for round_index in range(args.rounds):
                order = variants if round_index % 2 == 0 else variants[::-1]
                for variant in order:
                    if variant == "cli":
                        rate = run_cli(args.timesteps, Path(tmp) / "cli")
                    elif variant == "before":
                        rate = run_snippet(args.timesteps, False, Path(tmp) / "before.txt", args.before)
                    else:
                        rate = run_snippet(args.timesteps, variant == "one_thread", Path(tmp) / f"{variant}.txt")
                    rates[variant].append(rate)
                    print(f"round {round_index + 1} {variant:>10}: {rate:,.0f} env steps/s", flush=True)
    finally:
        for process in busy:
            process.kill()
    load = os.getloadavg()[0]
    before = f"; before: the snippet as written on {args.before}" if args.before is not None else ""
    print(f"\n{args.rounds} alternating rounds of {args.timesteps:,} env steps, {args.busy} busy process(es), "
          f"load {load:.1f} at the end; IPPO's defaults on simple_spread (8 copies), each run a fresh process{before}")
    reference = statistics.median(rates["one_thread"])
    for variant in variants:
        median = statistics.median(rates[variant])
        print(f"{variant:>10}: {median:,.0f} env steps/s (median; {', '.join(f'{r:,.0f}' for r in rates[variant])}), "
              f"{median / reference:.2f}x one_thread")
    return {variant: statistics.median(rates[variant]) for variant in variants}


if __name__ == "__main__":
    main()
