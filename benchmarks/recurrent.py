"""Memory on a partially observable task: IPPO with ``MlpLstmPolicy`` against ``MlpPolicy`` at equal env steps, and the
recurrent policy's cost in env steps/s beside sb3-contrib's ``RecurrentPPO`` + SuperSuit.

The task is ``simple_spread_v3`` (N=3, 25 cycles) with each agent's own velocity removed from its observation (the first
two entries; SuperSuit's ``observation_lambda_v0``), a standard way to make MPE partially observable: an agent sees
where it is relative to the landmarks and the others, not how it moves. Velocity can be inferred from two successive
observations, which a recurrent policy can remember and a feed-forward one cannot.

- **Learning** (``--seeds`` x ``--timesteps``): IPPO's defaults but ``async_training=False`` (identical runs on any
  machine), 8 env copies, both rows with one hidden layer of 64 units after the features (``net_arch=[64]``); the
  recurrent row has an LSTM of 64 units before it (sb3-contrib's default layout: separate actor and critic LSTMs).
  Every ``--eval-every`` env steps each model is evaluated on ``--eval-episodes`` episodes (deterministic actions,
  states carried through each episode, ``sb3_ippo.evaluate_policy``). The table gives the mean team return over seeds
  and min..max at each point.
- **Speed** (``--rounds`` x ``--speed-steps``): alternating rounds, in one process, of training IPPO ``MlpLstmPolicy``,
  IPPO ``MlpPolicy`` (same settings as above) and ``RecurrentPPO("MlpLstmPolicy")`` on SuperSuit's vec env of the same
  task (8 copies, so 24 entries, one per agent; one LSTM shared by every agent; ``n_steps=128`` per entry,
  ``batch_size=128``, ``n_epochs=10``, ``lstm_hidden_size=64``, ``net_arch=[64]``: sb3-contrib's defaults but the
  network size). Each round's env steps/s (one joint step of one copy = 1; the peer's agent-steps / 3) and the ratio
  to the peer within the same round.

Every process runs torch on one thread. The machine the figures come from is shared and loaded: speed figures are
ratios within rounds, not absolute rates.

    python benchmarks/recurrent.py [--seeds 3] [--timesteps 100000] [--eval-every 20000] [--rounds 3]
        [--speed-steps 10000] [--skip-learning] [--skip-speed] [--seed-offset 0] [--out docs/benchmarks/recurrent]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import supersuit as ss
from gymnasium import spaces
from mpe2 import simple_spread_v3
from pettingzoo import ParallelEnv
from sb3_contrib import RecurrentPPO

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from benchmarks.common import machine_description, peer_vec_env, set_torch_threads
from sb3_ippo import IPPO, evaluate_policy, make_vec_env

ENV_KWARGS = {"N": 3, "max_cycles": 25}
N_ENVS = 8
HIDDEN = 64
ROWS = {"ippo_lstm": "MlpLstmPolicy", "ippo_mlp": "MlpPolicy"}


def without_velocity(obs: np.ndarray, _space: spaces.Space) -> np.ndarray:
    return obs[2:]


def without_velocity_space(space: spaces.Box) -> spaces.Box:
    return spaces.Box(space.low[2:], space.high[2:], dtype=space.dtype)  # type: ignore[arg-type]


def partially_observable_spread(**kwargs: Any) -> ParallelEnv:
    """simple_spread_v3 (N=3, 25 cycles) with each agent's own velocity removed from its observation."""
    env = simple_spread_v3.parallel_env(**{**ENV_KWARGS, **kwargs})
    return ss.observation_lambda_v0(env, without_velocity, without_velocity_space)


def make_ippo(row: str, seed: int) -> IPPO:
    policy_kwargs: dict[str, Any] = {"net_arch": [HIDDEN]}
    if ROWS[row] == "MlpLstmPolicy":
        policy_kwargs["lstm_hidden_size"] = HIDDEN
    env = make_vec_env(partially_observable_spread, n_envs=N_ENVS, seed=seed)
    return IPPO(ROWS[row], env, policy_kwargs=policy_kwargs, seed=seed, async_training=False, batched=False)


def learning_run(row: str, seed: int, timesteps: int, eval_every: int, eval_episodes: int, out: Path) -> list[dict]:
    """Train one row on one seed; evaluate every ``eval_every`` env steps. Cached in ``out`` as JSON."""
    cache = out / f"learning_{row}_seed{seed}_{timesteps}.json"
    if cache.exists():
        return json.loads(cache.read_text())
    model = make_ippo(row, seed)
    points: list[dict] = []
    start = time.perf_counter()
    while model.num_timesteps < timesteps:
        model.learn(eval_every, reset_num_timesteps=False)
        mean, std = evaluate_policy(model, partially_observable_spread(), n_eval_episodes=eval_episodes)
        points.append(
            {"row": row, "seed": seed, "env_steps": model.num_timesteps, "team_return": mean, "std": std,
             "seconds": time.perf_counter() - start}
        )
        print(json.dumps(points[-1]), flush=True)
    out.mkdir(parents=True, exist_ok=True)
    cache.write_text(json.dumps(points))
    return points


def learning_table(points: list[dict], seeds: list[int]) -> str:
    lines = [
        f"Team return on simple_spread_v3 without velocities (N=3, 25 cycles), {len(seeds)} seeds {seeds}: mean over seeds "
        "[min..max], deterministic evaluation",
        f"{'env steps':>10} " + " ".join(f"{row:>28}" for row in ROWS),
    ]
    steps = sorted({point["env_steps"] for point in points})
    for step in steps:
        cells = []
        for row in ROWS:
            values = [p["team_return"] for p in points if p["row"] == row and p["env_steps"] == step]
            cells.append(f"{np.mean(values):8.2f} [{min(values):7.2f}..{max(values):7.2f}] n={len(values)}" if values else "-")
        lines.append(f"{step:>10} " + " ".join(f"{cell:>28}" for cell in cells))
    return "\n".join(lines)


def make_peer(seed: int) -> RecurrentPPO:
    venv = peer_vec_env(partially_observable_spread(), N_ENVS, seed)
    return RecurrentPPO(
        "MlpLstmPolicy",
        venv,
        n_steps=128,
        batch_size=128,
        n_epochs=10,
        policy_kwargs={"lstm_hidden_size": HIDDEN, "net_arch": [HIDDEN]},
        seed=seed,
        device="cpu",
    )


def speed(rounds: int, speed_steps: int) -> tuple[str, list[dict]]:
    """Alternating rounds of each row and the peer; env steps/s and the ratio to the peer within each round."""
    models: dict[str, Any] = {row: make_ippo(row, 0) for row in ROWS}
    models["recurrent_ppo_supersuit"] = make_peer(0)
    n_agents = ENV_KWARGS["N"]
    results: list[dict] = []
    for index in range(rounds):
        rates = {}
        for name, model in models.items():
            before = model.num_timesteps
            start = time.perf_counter()
            if name.startswith("ippo"):
                model.learn(speed_steps, reset_num_timesteps=index == 0)
                env_steps = model.num_timesteps - before
            else:
                model.learn(speed_steps * n_agents, reset_num_timesteps=index == 0)
                env_steps = (model.num_timesteps - before) / n_agents
            rates[name] = env_steps / (time.perf_counter() - start)
        for name, rate in rates.items():
            ratio = rate / rates["recurrent_ppo_supersuit"]
            results.append({"round": index, "row": name, "env_steps_per_s": rate, "ratio_to_peer": ratio})
        print(json.dumps(rates), flush=True)
    lines = [
        f"Env steps/s, {rounds} alternating rounds of {speed_steps} env steps (ratio to RecurrentPPO + SuperSuit in the "
        "same round; the machine is shared and loaded: read the ratios)",
        f"{'row':>26} {'env steps/s (mean)':>20} {'ratio to peer (mean [min..max])':>34}",
    ]
    for name in models:
        mine = [r for r in results if r["row"] == name]
        ratios = [r["ratio_to_peer"] for r in mine]
        lines.append(
            f"{name:>26} {np.mean([r['env_steps_per_s'] for r in mine]):>20.0f} "
            f"{np.mean(ratios):>12.2f} [{min(ratios):.2f}..{max(ratios):.2f}]"
        )
    return "\n".join(lines), results


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--seed-offset", type=int, default=0)
    parser.add_argument("--timesteps", type=int, default=100_000)
    parser.add_argument("--eval-every", type=int, default=20_000)
    parser.add_argument("--eval-episodes", type=int, default=20)
    parser.add_argument("--rows", nargs="+", default=list(ROWS), choices=list(ROWS))
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--speed-steps", type=int, default=10_000)
    parser.add_argument("--skip-learning", action="store_true")
    parser.add_argument("--skip-speed", action="store_true")
    parser.add_argument("--out", type=Path, default=Path("docs/benchmarks/recurrent"))
    args = parser.parse_args(argv)
    set_torch_threads()
    args.out.mkdir(parents=True, exist_ok=True)
    header = machine_description()
    print(header, flush=True)
    if not args.skip_learning:
        seeds = list(range(args.seed_offset, args.seed_offset + args.seeds))
        points = [
            point
            for seed in seeds
            for row in args.rows
            for point in learning_run(row, seed, args.timesteps, args.eval_every, args.eval_episodes, args.out)
        ]
        table = learning_table(points, seeds)
        print(table)
        (args.out / f"learning_seeds{seeds[0]}-{seeds[-1]}.txt").write_text(f"{header}\n{table}\n")
    if not args.skip_speed:
        table, results = speed(args.rounds, args.speed_steps)
        print(table)
        (args.out / "speed.txt").write_text(f"{header}\n{table}\n")
        (args.out / "speed.json").write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
