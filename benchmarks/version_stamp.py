"""Which version a trajectory carries (``version_stamp``): how much data each choice drops as stale, and how each
learns, with and without ``async_training``.

1. Stale share: a 2-agent test env whose episodes last 2 to 30 steps (drawn at each reset), 4 copies,
   ``n_episodes=4``, ``max_version_lag=1``: the share of finished trajectories dropped as stale.
2. Learning: gymnasium's CartPole-v1 as a one-agent parallel env (episodes of varying length, so episodes span
   updates), 4 copies, IPPO's defaults with 64x64 networks except n_epochs 80 (the default before issue 22, as in
   the documented runs; now 20): the mean training return over the last 10% of the run and the deterministic
   return over 20 evaluation episodes, per setting and seed.

Both parts set ``async_training`` explicitly in each mode (False: sync, True: async), never the default "auto".

    python benchmarks/version_stamp.py [--stale-steps 20000] [--learn-steps 60000] [--seeds 2]
"""

from __future__ import annotations

import argparse
import itertools
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
from stable_baselines3.common.callbacks import BaseCallback

from sb3_ippo import IPPO, evaluate_policy, make_vec_env
from tests.envs import CartPoleParallelEnv, VariableLengthEnv

STAMPS = ("episode_end", "first_step")
MODES = {"sync": False, "async": True}
# The learning runs' n_epochs: 80, the default before issue 22 (docs/algorithm.md's figures).
LEARN_N_EPOCHS = 80


class EpisodeReturns(BaseCallback):
    """Keeps every finished episode's team return, in order."""

    def __init__(self) -> None:
        super().__init__()
        self.returns: list[float] = []

    def _on_step(self) -> bool:
        for info in self.locals["infos"]:
            if "episode" in info:
                self.returns.append(float(info["episode"]["r"]))
        return True


def stale_share(version_stamp: str, async_training: bool, timesteps: int, seed: int) -> tuple[float, int]:
    """The share of finished trajectories dropped as stale, and the number of updates."""
    env = make_vec_env(VariableLengthEnv, n_envs=4, seed=seed, env_kwargs=dict(n_agents=2, min_length=2, max_length=30))
    model = IPPO("MlpPolicy", env, n_episodes=4, n_epochs=2, version_stamp=version_stamp, async_training=async_training,
                 policy_kwargs=dict(net_arch=[16]), seed=seed, device="cpu")
    episodes = EpisodeReturns()
    model.learn(timesteps, callback=episodes)
    finished = 2 * len(episodes.returns)  # both agents end every episode together
    return model.stale_episodes_dropped / finished, model.policy_version


def learning(version_stamp: str, async_training: bool, timesteps: int, seed: int) -> tuple[float, float, float]:
    """Training return over the last 10% of episodes, deterministic evaluation return, wall seconds."""
    env = make_vec_env(CartPoleParallelEnv, n_envs=4, seed=seed)
    model = IPPO("MlpPolicy", env, n_epochs=LEARN_N_EPOCHS, version_stamp=version_stamp, async_training=async_training,
                 policy_kwargs=dict(net_arch=common.NET_ARCH), seed=seed, device="cpu")
    episodes = EpisodeReturns()
    start = time.perf_counter()
    model.learn(timesteps, callback=episodes)
    seconds = time.perf_counter() - start
    tail = episodes.returns[-max(1, len(episodes.returns) // 10):]
    evaluation, _ = evaluate_policy(model, make_vec_env(CartPoleParallelEnv, n_envs=1, seed=10_000 + seed), n_eval_episodes=20)
    return statistics.mean(tail), float(evaluation), seconds


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--stale-steps", type=int, default=20_000, help="env steps of each stale-share run")
    parser.add_argument("--learn-steps", type=int, default=60_000, help="env steps of each learning run (0: skip)")
    parser.add_argument("--seeds", type=int, default=2, help="seeds of each learning setting")
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> None:
    args = parse_args(argv)
    common.set_torch_threads(1)
    print(common.machine_description())
    print(f"Stale share: 2 agents, episodes of 2-30 steps, 4 copies, n_episodes=4, max_version_lag=1, "
          f"{args.stale_steps:,} env steps")
    print(f"{'version_stamp':<14}{'mode':<7}{'stale share':>12}{'updates':>9}")
    for stamp, mode in itertools.product(STAMPS, MODES):
        share, updates = stale_share(stamp, MODES[mode], args.stale_steps, seed=0)
        print(f"{stamp:<14}{mode:<7}{share:>12.1%}{updates:>9}", flush=True)
    if args.learn_steps <= 0:
        return
    print(f"\nLearning: CartPole-v1 (one agent), 4 copies, IPPO defaults but n_epochs {LEARN_N_EPOCHS}, 64x64, "
          f"{args.learn_steps:,} env steps, {args.seeds} seeds")
    print(f"{'version_stamp':<14}{'mode':<7}{'seed':>5}{'train (last 10%)':>18}{'eval (20 ep.)':>15}{'seconds':>9}")
    for stamp, mode in itertools.product(STAMPS, MODES):
        for seed in range(args.seeds):
            train_return, eval_return, seconds = learning(stamp, MODES[mode], args.learn_steps, seed)
            print(f"{stamp:<14}{mode:<7}{seed:>5}{train_return:>18.1f}{eval_return:>15.1f}{seconds:>9.0f}", flush=True)


if __name__ == "__main__":
    main()
