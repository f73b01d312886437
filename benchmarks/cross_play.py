"""Cross-play on simple_adversary: every algorithm's good agents against every algorithm's adversary.

In a competitive env a side's return scores a pairing: a stronger adversary lowers the good agents' return however
well they play, so the two sides' training returns cannot tell a better good side from a weaker opponent. Cross-play
holds the opponent fixed: the good agents of each trained model play the adversary of each trained model (every seed
against every seed, the same episodes for every pairing), so two algorithms' good sides are compared against the same
adversaries, and two adversaries against the same good agents. Within one algorithm, the two sides of one run (which
trained against each other) are not paired (unless ``--own-pairs``): every cell pairs sides that never met in
training.

It reads the final models ``benchmarks/learning.py`` saves next to its cached runs, so run that first with the same
``--cache``, ``--timesteps`` and algorithms::

    python benchmarks/learning.py --envs simple_adversary_v3 --algos ippo_shared_ppo peer --jobs 2
    python benchmarks/cross_play.py --algos ippo_shared_ppo peer

Prints, per mode (deterministic and stochastic actions), the good side's summed return and the adversary's return
for each (good side, adversary) pair of algorithms: the mean over all seed pairs, with the range of the per-seed-pair
means. Writes ``cross_play.txt`` and ``cross_play.csv`` to ``--out``.
"""

from __future__ import annotations

import argparse
import itertools
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch as th
from stable_baselines3 import PPO

from sb3_ippo import IPPO

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
from learning import ALGOS, cache_path

ENV_NAME = "simple_adversary_v3"
Actor = Callable[[str, np.ndarray], Any]


def is_adversary(agent: str) -> bool:
    return agent.startswith("adversary")


def load_actor(algo: str, path: Path, deterministic: bool) -> Actor:
    """One agent's action from its own observation, for either library's model."""
    if not path.exists():
        raise FileNotFoundError(f"{path} not found: run benchmarks/learning.py with this --cache and --timesteps first")
    if algo == "peer":
        peer = PPO.load(path, device="cpu")
        shape = peer.observation_space.shape
        assert shape is not None

        def act_peer(agent: str, obs: np.ndarray) -> Any:
            # SuperSuit's pad_observations_v0: zeros appended up to the largest observation.
            padded = np.pad(obs, [(0, total - size) for total, size in zip(shape, obs.shape, strict=True)])
            return peer.predict(padded, deterministic=deterministic)[0]

        return act_peer
    model = IPPO.load(path, device="cpu")

    def act_ippo(agent: str, obs: np.ndarray) -> Any:
        return model.predict({agent: obs}, deterministic=deterministic)[0][agent]

    return act_ippo


def play(good: Actor, adversary: Actor, n_episodes: int, seed: int) -> tuple[float, float]:
    """Mean return per episode of the good side (its agents summed) and of the adversary side.

    Every pairing plays the same episodes: the same resets and, for stochastic actions, the same torch random stream.
    """
    th.manual_seed(seed)
    env = common.env_fn(ENV_NAME)(**common.env_kwargs(ENV_NAME))
    good_total = adversary_total = 0.0
    for episode in range(n_episodes):
        obs, _ = env.reset(seed=seed + episode)
        while env.agents:
            actions = {
                agent: common.python_action((adversary if is_adversary(agent) else good)(agent, obs[agent]))
                for agent in env.agents
            }
            obs, rewards, _, _, _ = env.step(actions)
            for agent, reward in rewards.items():
                if is_adversary(agent):
                    adversary_total += float(reward)
                else:
                    good_total += float(reward)
    env.close()
    return good_total / n_episodes, adversary_total / n_episodes


def cross_play(args: argparse.Namespace) -> list[dict[str, Any]]:
    rows = []
    for mode in ("deterministic", "stochastic"):
        deterministic = mode == "deterministic"
        actors = {
            (algo, seed): load_actor(algo, model_path(args, algo, seed), deterministic)
            for algo in args.algos
            for seed in range(args.seeds)
        }
        for good_algo, adversary_algo in itertools.product(args.algos, repeat=2):
            scores = [
                play(actors[good_algo, good_seed], actors[adversary_algo, adversary_seed], args.episodes, args.eval_seed)
                for good_seed, adversary_seed in seed_pairs(args.seeds, good_algo == adversary_algo and not args.own_pairs)
            ]
            if not scores:  # one seed, within one algorithm
                continue
            good, adversary = np.array(scores).T
            rows.append({
                "mode": mode, "good_side": good_algo, "adversary": adversary_algo, "seed_pairs": len(scores),
                "good_return": good.mean(), "good_min": good.min(), "good_max": good.max(),
                "adversary_return": adversary.mean(), "adversary_min": adversary.min(), "adversary_max": adversary.max(),
            })
    return rows


def seed_pairs(n_seeds: int, different_seeds: bool) -> list[tuple[int, int]]:
    """(good side's seed, adversary's seed) pairs: all of them, or only those of two different runs."""
    pairs = itertools.product(range(n_seeds), repeat=2)
    return [(good, adversary) for good, adversary in pairs if not (different_seeds and good == adversary)]


def model_path(args: argparse.Namespace, algo: str, seed: int) -> Path:
    task = {"env": ENV_NAME, "algo": algo, "seed": seed, "timesteps": args.timesteps,
            "peer_n_steps": args.peer_n_steps, "peer_batch_size": args.peer_batch_size}
    return cache_path(args.cache, task).with_suffix(".zip")


def report(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    by_pair = {(row["mode"], row["good_side"], row["adversary"]): row for row in rows}
    lines = [
        common.machine_description(),
        f"Cross-play on {ENV_NAME}: models after {args.timesteps:,} env steps, seeds 0..{args.seeds - 1} of each "
        f"algorithm, {args.episodes} episodes per seed pair (reset seeds {args.eval_seed}..).",
        f"Cell: mean over the seed pairs (min..max of the per-pair means): all {args.seeds ** 2} pairs across two "
        + ("algorithms and within one (--own-pairs)." if args.own_pairs else
           f"algorithms, the {args.seeds * (args.seeds - 1)} pairs of different seeds within one (a run's own sides "
           "trained against each other)."),
    ]
    for mode in ("deterministic", "stochastic"):
        for side, key in (("good side (summed)", "good_return"), ("adversary", "adversary_return")):
            lines += ["", f"{mode} actions, {side} return; rows: the good side's algorithm, columns: the adversary's"]
            lines.append(f"{'good side / adversary':>24}" + "".join(f"{algo:>26}" for algo in args.algos))
            for good_algo in args.algos:
                cells = []
                for adversary_algo in args.algos:
                    row = by_pair.get((mode, good_algo, adversary_algo))
                    if row is None:
                        cells.append("-")
                        continue
                    low, high = row[key.replace("return", "min")], row[key.replace("return", "max")]
                    cells.append(f"{row[key]:>8.2f} ({low:.1f}..{high:.1f})")
                lines.append(f"{good_algo:>24}" + "".join(f"{cell:>26}" for cell in cells))
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--algos", nargs="+", default=["ippo_shared_ppo", "peer"], choices=ALGOS)
    parser.add_argument("--seeds", type=int, default=3, help="seeds 0..S-1 of each algorithm")
    parser.add_argument("--timesteps", type=int, default=500_000, help="env steps of the learning.py runs")
    parser.add_argument("--episodes", type=int, default=100, help="episodes per seed pair")
    parser.add_argument("--own-pairs", action="store_true",
                        help="within one algorithm, also pair each run's good side with its own adversary")
    parser.add_argument("--eval-seed", type=int, default=20_000, help="reset seed of the first episode")
    parser.add_argument("--peer-n-steps", type=int, default=256, help="as learning.py's, to find the peer's runs")
    parser.add_argument("--peer-batch-size", type=int, default=256, help="as learning.py's, to find the peer's runs")
    parser.add_argument("--cache", type=Path, default=Path("runs/learning_benchmark"), help="learning.py's --cache")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks"), help="where the TXT and CSV go")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> list[dict[str, Any]]:
    args = parse_args(argv)
    common.set_torch_threads(1)
    rows = cross_play(args)
    text = report(rows, args)
    print(text)
    common.write_results(args.out, "cross_play", text, rows)
    return rows


if __name__ == "__main__":
    main()
