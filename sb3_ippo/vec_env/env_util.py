"""``make_vec_env``: the vectorized env of ``n_envs`` copies of a PettingZoo env, of the kind asked for (SB3's
``env_util.make_vec_env`` counterpart), and ``as_multiagent_vec_env``, which turns a single env into one."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import gymnasium as gym
from pettingzoo import AECEnv
from stable_baselines3.common.vec_env import VecNormalize
from stable_baselines3.common.vec_env.base_vec_env import VecEnv

from sb3_ippo.vec_env.base import DEFAULT_MAX_RESTARTS, MultiAgentVecEnv, check_env_error_policy
from sb3_ippo.vec_env.batched import BatchedMultiAgentVecEnv, is_batched_env, make_batched_vec_env
from sb3_ippo.vec_env.copies import is_parallel_env, to_parallel_env
from sb3_ippo.vec_env.dummy import DummyMultiAgentVecEnv
from sb3_ippo.vec_env.subproc import SubprocMultiAgentVecEnv
from sb3_ippo.games.turn_based import TurnBasedMultiAgentVecEnv, make_turn_based_vec_env, needs_turns


def make_vec_env(
    env_fn: Callable[..., Any],
    n_envs: int = 1,
    seed: int | None = None,
    vec_env_cls: str = "dummy",
    env_kwargs: dict[str, Any] | None = None,
    on_env_error: str = "raise",
    max_restarts: int = DEFAULT_MAX_RESTARTS,
    n_workers: int | None = None,
    ray_address: str | None = None,
    critic_input: Any = None,
) -> MultiAgentVecEnv:
    """Run ``n_envs`` copies of a PettingZoo env, each resetting itself at the end of its episodes.

    :param env_fn: A factory of PettingZoo envs, e.g. ``simple_spread_v3.parallel_env``. An AEC env is
        converted to a parallel one where PettingZoo allows it; otherwise (the classic games) its copies are stepped
        turn by turn (:mod:`sb3_ippo.games.turn_based`).
    :param n_envs: Number of copies.
    :param seed: Copy ``i`` is seeded with ``seed + i`` at its first reset (None: unseeded).
    :param vec_env_cls: ``"dummy"`` steps the copies in this process, ``"subproc"`` in worker processes, ``"ray"`` in
        Ray actors, on this machine or a cluster (needs ``pip install "sb3-ippo[ray]"``; see ``docs/usage.md``).
        ``"batched"``: ``env_fn(num_envs=n_envs, **env_kwargs)`` is one env that steps every copy at once (VMAS's
        ``vmas.make_env``, or :class:`sb3_ippo.vec_env.batched.BatchedParallelEnv`).
    :param env_kwargs: Keyword arguments for ``env_fn``.
    :param on_env_error: What a copy whose env raises in ``step`` or ``reset`` (or whose worker process dies)
        does: ``"raise"`` a ``RuntimeError`` with the env's traceback; ``"restart"``: the copy is rebuilt from
        ``env_fn``, reseeded (``seed + i + k * n_envs`` at its ``k``-th restart) and reset, only its episode in
        progress is lost, and the step reports it (``infos[i]["env_restarted"]``, ``MultiAgentStep.restarted``),
        which IPPO counts (``rollout/env_restarts``, ``rollout/episodes_lost``).
    :param max_restarts: With ``"restart"``: the restarts allowed in all (every rebuilt copy counts one); the next
        failure raises.
    :param n_workers: ``"subproc"``: worker processes (default ``min(n_envs, cpu_count)``); ``"ray"``: actors (default
        ``min(n_envs, CPUs of the Ray cluster)``). Each holds a contiguous slice of the copies.
    :param ray_address: ``"ray"``: the cluster to join if Ray is not initialized yet (None: start a local one;
        ``"auto"``: the one ``ray start --head`` started on this machine).
    :param critic_input: For MAPPO: ``"state"``, ``"joint_obs"`` or a ``sb3_ippo.common.critic_input.CriticInput``; every
        copy then gives each agent ``{"obs": own observation, "critic": the critic's input}``
        (:class:`sb3_ippo.common.critic_input.CriticInputWrapper`). None: the env's observations.
    """
    if not callable(env_fn):
        made = is_parallel_env(env_fn) or isinstance(env_fn, AECEnv)
        raise TypeError(
            "env_fn must be a callable that returns a PettingZoo env (e.g. simple_spread_v3.parallel_env, not called), "
            f"got {'the env ' if made else ''}{env_fn!r}"
        )
    if isinstance(env_fn, type) and issubclass(env_fn, gym.Env):
        raise TypeError(f"{env_fn.__name__} is a gymnasium env; make_vec_env needs a factory of PettingZoo envs")
    if not isinstance(n_envs, int) or n_envs < 1:
        raise ValueError(f"n_envs must be a positive integer, got {n_envs!r}")
    kwargs = env_kwargs or {}
    if vec_env_cls == "batched":  # one env that steps all the copies itself
        return make_batched_vec_env(env_fn, n_envs, seed, kwargs, critic_input)

    spec = None
    if critic_input is not None:
        from sb3_ippo.common.critic_input import as_critic_input  # MAPPO's concern, imported only when asked for

        spec = as_critic_input(critic_input)

    def make_env() -> Any:
        env = env_fn(**kwargs)
        if spec is None:
            return env
        from sb3_ippo.common.critic_input import CriticInputWrapper

        if needs_turns(env):
            raise ValueError("critic_input (MAPPO) is not supported for turn-based games (AEC envs stepped turn by turn)")
        return CriticInputWrapper(to_parallel_env(env), spec)

    env_fns = [make_env for _ in range(n_envs)]
    vec_env: MultiAgentVecEnv
    check_env_error_policy(on_env_error, max_restarts)
    probe = make_env()  # used as copy 0 where the copies run in this process
    if needs_turns(probe):  # an AEC game that cannot run in parallel: its copies are stepped turn by turn
        vec_env = make_turn_based_vec_env(env_fns, vec_env_cls, on_env_error, max_restarts, first_env=probe)
    elif vec_env_cls == "dummy":
        vec_env = DummyMultiAgentVecEnv(env_fns, on_env_error=on_env_error, max_restarts=max_restarts, first_env=probe)
    else:
        if not isinstance(probe, type) and callable(getattr(probe, "close", None)):
            probe.close()
        if vec_env_cls == "subproc":
            vec_env = SubprocMultiAgentVecEnv(
                env_fns, n_workers=n_workers, on_env_error=on_env_error, max_restarts=max_restarts
            )
        elif vec_env_cls == "ray":
            from sb3_ippo.vec_env.ray import RayMultiAgentVecEnv  # imports Ray, only when asked for

            vec_env = RayMultiAgentVecEnv(
                env_fns, n_workers=n_workers, ray_address=ray_address, on_env_error=on_env_error, max_restarts=max_restarts
            )
        else:
            raise ValueError(
                f"vec_env_cls must be 'dummy', 'subproc' or 'ray' ('batched': one env, all copies), got {vec_env_cls!r}"
            )
    if seed is not None:
        vec_env.seed(seed)
    vec_env.critic_input = spec
    return vec_env


def as_multiagent_vec_env(env: Any) -> MultiAgentVecEnv:
    """Wrap a single PettingZoo env (parallel or AEC) as a one-copy vectorized env, a natively batched env (VMAS, or
    :class:`~sb3_ippo.vec_env.batched.BatchedParallelEnv`) as its copies; pass a vectorized one through."""
    if isinstance(env, MultiAgentVecEnv):
        return env
    if env is None:
        raise ValueError("An environment is needed: pass a PettingZoo ParallelEnv, an AECEnv, or make_vec_env(...)")
    if isinstance(env, VecNormalize):
        raise TypeError(
            "Got an SB3 VecNormalize: IPPO normalizes per agent itself. Pass the PettingZoo env or "
            "sb3_ippo.make_vec_env(...) unwrapped, with IPPO(..., normalize_obs=True) for observations (and "
            "normalize_returns=True, the default, for value targets)."
        )
    if is_batched_env(env):
        return BatchedMultiAgentVecEnv(env)
    if isinstance(env, VecEnv):
        raise TypeError(
            f"Got the SB3 VecEnv {env}; sb3_ippo needs a PettingZoo env or sb3_ippo.make_vec_env(env_fn, n_envs=...)"
        )
    if needs_turns(env):
        return TurnBasedMultiAgentVecEnv([lambda: env])
    parallel_env = to_parallel_env(env)
    return DummyMultiAgentVecEnv([lambda: parallel_env])
