"""Why the peer learns sisl pursuit faster than IPPO configured as the peer: the differences left, one at a time.

``benchmarks/learning.py``'s ``ippo_as_peer`` row sets IPPO up as the peer (SB3 PPO + SuperSuit, ``n_steps=256`` per
``VecEnv`` entry, ``batch_size=256``): one network shared by the 8 pursuers, 10 shuffled passes over minibatches of
256, no KL stop, an update per 256 steps of each of the 8 env copies, raw returns, the time limit as a termination.
Three differences from SB3's PPO remain, and the variants here remove them (synchronous updates throughout):

- ``as_peer``: ``ippo_as_peer`` as it is (``async_training=False``).
- ``sb3_update``: plus SB3's GAE lambda (0.95, IPPO's default is 0.97) and SB3's advantage normalization per
  minibatch (IPPO normalizes once over the batch; it has no per-minibatch option, so this variant wraps the update's
  loss function).
- ``sb3_cadence``: ``sb3_update`` plus SB3's rollout cadence. When this script was written, ``rollout_len=256`` cut a
  trajectory when *it* had 256 steps; an episode of 500 steps thus ended in a chunk of 244, the update (2,048
  transitions per agent) waited for the next chunks, and from the second update on every batch held data of the
  previous policy (21 updates in 50k env steps). SB3 collects 256 steps of each copy across episode ends: this
  variant cut every open trajectory of a copy each 256 steps of that copy, counted across episodes, which gave the
  peer's 24 updates in 50k env steps. ``sb3_ippo`` now cuts so itself (``rollout_len``), so ``as_peer`` and
  ``sb3_update`` have the cadence too, and ``sb3_cadence`` runs as ``sb3_update`` does (the patch below cuts where
  the buffer does); the ``as_peer`` and ``sb3_update`` figures of ``docs/benchmarks.md`` were measured before.
- ``peer``: the peer itself (``benchmarks/common.py``).

Each run prints the mean training-episode team return per bin of 5,000 env steps, the last 10% of the budget, the
number of updates, and the final model's team return over 4 evaluation episodes, stochastic and deterministic.

    python benchmarks/pursuit_gap.py --variants peer as_peer sb3_update sb3_cadence --seeds 0 1 2 [--timesteps 50000]
"""

from __future__ import annotations

import argparse
import inspect
import json
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch as th
from pettingzoo.sisl import pursuit_v5

sys.path.insert(0, str(Path(__file__).resolve().parent))
import common
import learning

from sb3_ippo import IPPO, make_vec_env
from sb3_ippo import buffer as buffer_module
from sb3_ippo.update import ppo as ppo_module

VARIANTS = ("peer", "as_peer", "sb3_update", "sb3_cadence")
ENV_KWARGS = {"max_cycles": 500}
N_ENVS, BIN = 8, 5_000
PEER_N_STEPS, PEER_BATCH_SIZE = 256, 256  # the peer of benchmarks/learning.py and time_to_quality.py


def per_minibatch_advantages() -> None:
    """Normalize the advantages of every minibatch on its own, as SB3's PPO does (with ``normalize_advantage=False``
    so that IPPO's normalization over the batch is off)."""
    losses = ppo_module._losses

    def normalized(policy: Any, batch: Any, advantages: th.Tensor, clip_range: float, clip_range_vf: Any) -> Any:
        if len(advantages) > 1:
            advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
        return losses(policy, batch, advantages, clip_range, clip_range_vf)

    ppo_module._losses = normalized


def sb3_rollout_cadence() -> None:
    """Cut every open trajectory of a copy each ``rollout_len`` steps of that copy, counted across episode ends (SB3's
    rollout of ``n_steps`` per env), instead of when the trajectory itself reaches ``rollout_len`` steps. (The patch
    that measured the cadence; ``AgentEpisodeBuffer`` now cuts so itself, where every agent acts in every step.)"""
    add = buffer_module.AgentEpisodeBuffer.add
    signature = inspect.signature(add)

    def add_on_cadence(self: Any, *args: Any, **kwargs: Any) -> None:
        rollout_len, self.rollout_len = self.rollout_len, None
        add(self, *args, **kwargs)
        self.rollout_len = rollout_len
        call = signature.bind(self, *args, **kwargs)
        call.apply_defaults()
        acted, next_obs = call.arguments["acted"], call.arguments["next_obs"]
        policy_version, max_version_lag = call.arguments["policy_version"], call.arguments["max_version_lag"]
        since_cut = self.__dict__.setdefault("steps_since_cut", [0] * self.n_envs)
        for env_idx in np.flatnonzero(acted).tolist():
            since_cut[env_idx] += 1
            if since_cut[env_idx] >= rollout_len:
                since_cut[env_idx] = 0
                if self._open[env_idx] is not None:
                    bootstrap = buffer_module._row(next_obs, env_idx)
                    self._finish(env_idx, False, bootstrap, policy_version, max_version_lag, truncated=False)

    buffer_module.AgentEpisodeBuffer.add = add_on_cadence  # type: ignore[method-assign]


def train(variant: str, seed: int, timesteps: int) -> tuple[Any, common.EpisodeRecorder, bool]:
    agents = list(pursuit_v5.parallel_env(**ENV_KWARGS).possible_agents)
    if variant == "peer":
        vec_env = common.peer_vec_env(pursuit_v5.parallel_env(**ENV_KWARGS), N_ENVS, seed)
        recorder = common.EpisodeRecorder(agents, peer=True)
        peer = common.make_peer(vec_env, seed, n_steps=PEER_N_STEPS, batch_size=PEER_BATCH_SIZE)
        peer.learn(timesteps * len(agents), callback=recorder)
        return peer, recorder, True
    settings = {**learning.IPPO_VARIANTS["ippo_as_peer"], "async_training": False}
    if variant in ("sb3_update", "sb3_cadence"):
        per_minibatch_advantages()
        settings.update(gae_lambda=0.95, normalize_advantage=False)
    if variant == "sb3_cadence":
        sb3_rollout_cadence()
    env = make_vec_env(lambda: pursuit_v5.parallel_env(**ENV_KWARGS), n_envs=N_ENVS, seed=seed)
    recorder = common.EpisodeRecorder(agents, peer=False)
    model = IPPO("MlpPolicy", env, seed=seed, device="cpu", **settings)
    model.learn(timesteps, callback=recorder)
    return model, recorder, False


def run(variant: str, seed: int, timesteps: int) -> dict[str, Any]:
    start = time.perf_counter()
    model, recorder, stacked = train(variant, seed, timesteps)
    seconds = time.perf_counter() - start
    # The learning comparison's readers: mean team return per bin of env steps, and over the last 10% of the budget.
    result, agents = {"episodes": recorder.episodes}, list(pursuit_v5.parallel_env(**ENV_KWARGS).possible_agents)
    ends, means = learning.binned_curve(result, agents, BIN, timesteps)
    by_end = dict(zip(ends.tolist(), means.tolist(), strict=True))
    has_tail = any(0.9 * timesteps < e["env_steps"] <= timesteps for e in recorder.episodes)

    def evaluate(deterministic: bool) -> float:
        env = pursuit_v5.parallel_env(**ENV_KWARGS)
        return round(common.evaluate_model(model, env, 4, 1000, deterministic, stacked)["team_return"], 1)

    return {
        "variant": variant,
        "seed": seed,
        "bins": [round(by_end[end], 1) if end in by_end else None for end in range(BIN, timesteps + 1, BIN)],
        "last_10pct": round(learning.final_training_return(result, agents, timesteps), 1) if has_tail else None,
        # Updates within the budget: the peer's come every PEER_N_STEPS steps of its copies (SB3 then trains once more on
        # the rollout that crosses the budget, past the last episode counted here).
        "updates": model.policy_version if not stacked else timesteps // (PEER_N_STEPS * N_ENVS),
        "eval_stochastic": evaluate(False),
        "eval_deterministic": evaluate(True),
        "seconds": round(seconds),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--variants", nargs="+", choices=VARIANTS, default=list(VARIANTS))
    parser.add_argument("--seeds", nargs="+", type=int, default=[0, 1, 2])
    parser.add_argument("--timesteps", type=int, default=50_000)
    args = parser.parse_args()
    common.set_torch_threads(1)
    # One process per run: the variants patch IPPO's update and buffer.
    if len(args.variants) * len(args.seeds) > 1:
        for variant in args.variants:
            for seed in args.seeds:
                command = [sys.executable, __file__, "--variants", variant, "--seeds", str(seed)]
                subprocess.run([*command, "--timesteps", str(args.timesteps)], check=True)
        return
    print(json.dumps(run(args.variants[0], args.seeds[0], args.timesteps)), flush=True)


if __name__ == "__main__":
    main()
