"""IPPO self-play on PettingZoo's connect_four_v3: a turn-based game with action masks, one network for both seats.

connect_four_v3 is an AEC env that cannot run in parallel: ``make_vec_env`` steps its copies turn by turn, and each
seat's transition runs from its move to its next move, the opponent's reply included. The observation is a Dict
with an ``action_mask`` (the columns that are not full): IPPO gives each seat sb3-contrib's maskable policy, so no
illegal move is ever played. ``share_parameters=True`` makes both seats one network (self-play), and the self-play
pool has one seat of every game played by an earlier snapshot of the learner. A ``MultiAgentEvalCallback`` tracks
the win rate against a uniformly random player as training goes (``eval/win_rate`` in the log).

    python examples/connect_four_self_play.py                      # 200k moves, a few minutes on 2 cores
    python examples/connect_four_self_play.py --timesteps 500000
"""

from __future__ import annotations

import argparse
import pathlib
import time
from collections.abc import Sequence

import torch as th
from pettingzoo.classic import connect_four_v3
from stable_baselines3.common.utils import LinearSchedule

from sb3_ippo import IPPO, MultiAgentEvalCallback, evaluate_policy, make_vec_env

# The settings benchmarks/games.py measured (docs/benchmarks.md#turn-based-games): per seat, an update every 512
# moves, minibatches of 128, 10 passes, a learning rate decaying linearly from 1e-3 to 0, a little entropy, and a
# 256x256 ReLU network.
HYPERPARAMETERS = dict(
    n_steps=512,
    batch_size=128,
    n_epochs=10,
    learning_rate=LinearSchedule(1e-3, 0.0, 1.0),
    ent_coef=0.01,
    policy_kwargs=dict(net_arch=[256, 256], activation_fn=th.nn.ReLU),
)


def main(argv: Sequence[str] | None = None) -> dict[str, float]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--timesteps", type=int, default=200_000, help="moves to train for (default: 200000)")
    parser.add_argument("--eval-episodes", type=int, default=200, help="games per seat against random (default: 200)")
    parser.add_argument("--out", default="runs/examples", help="folder of the saved model (default: runs/examples)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    env = make_vec_env(connect_four_v3.env, n_envs=8, seed=args.seed)
    model = IPPO(
        "MlpPolicy",
        env,
        share_parameters=True,  # player_0 and player_1: one network, trained on both seats' moves
        self_play_pool=dict(snapshot_every=10, size=20),  # one seat of each game: a snapshot of the last 200 updates
        seed=args.seed,
        verbose=1,
        **HYPERPARAMETERS,
    )
    print(f"Groups {dict(model.groups)}; policy {type(model.policies['player_0']).__name__}")
    win_rate = MultiAgentEvalCallback(
        make_vec_env(connect_four_v3.env, n_envs=4, seed=args.seed + 1000),
        opponent="random",
        n_eval_episodes=max(args.eval_episodes // 4, 2),
        eval_freq=max(args.timesteps // 8 // env.num_envs, 1),
        verbose=0,
    )
    start = time.perf_counter()
    model.learn(total_timesteps=args.timesteps, callback=win_rate, log_interval=20)
    elapsed = time.perf_counter() - start
    print(f"Trained for {model.num_timesteps} env steps ({model.policy_version} updates) in {elapsed:.0f} s")

    path = pathlib.Path(args.out) / "ippo_connect_four.zip"
    path.parent.mkdir(parents=True, exist_ok=True)
    model.save(path)
    env.close()
    model = IPPO.load(path)

    eval_env = make_vec_env(connect_four_v3.env, n_envs=4, seed=args.seed + 2000)
    records = evaluate_policy(model, eval_env, n_eval_episodes=args.eval_episodes, opponent="random")
    assert isinstance(records, dict)
    for seat, record in records.items():
        print(f"{seat} against a random player: {record}")
    return {seat: record.win_rate for seat, record in records.items()}


if __name__ == "__main__":
    main()
