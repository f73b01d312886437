"""Copies stepped one after the other in this process (SB3's ``DummyVecEnv`` counterpart)."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from stable_baselines3.common.vec_env.base_vec_env import VecEnvIndices

from sb3_ippo.vec_env.base import DEFAULT_MAX_RESTARTS, AgentID, MultiAgentStep, MultiAgentVecEnv, ObsArray
from sb3_ippo.vec_env.copies import CopyFailure, EpisodeCopy, parallel_copy, rebuild_copy, reset_copy, step_copy


class DummyMultiAgentVecEnv(MultiAgentVecEnv):
    """Copies stepped one after the other in this process (SB3's ``DummyVecEnv`` counterpart).

    :param first_env: An env already made by ``env_fns[0]`` (``make_vec_env``'s probe), used as copy 0; a restart of
        copy 0 still makes a new one from ``env_fns[0]``.
    """

    def __init__(
        self,
        env_fns: Sequence[Callable[[], Any]],
        max_episode_steps: int | None = None,
        on_env_error: str = "raise",
        max_restarts: int = DEFAULT_MAX_RESTARTS,
        first_env: Any = None,
    ) -> None:
        self._env_fns = list(env_fns)
        self._copies = [
            self._make_copy(first_env if index == 0 and first_env is not None else env_fn(), max_episode_steps)
            for index, env_fn in enumerate(env_fns)
        ]
        self.envs = [episode_copy.env for episode_copy in self._copies]
        self._max_episode_steps = max_episode_steps
        first = self.envs[0]
        agents = list(first.possible_agents)
        super().__init__(
            len(self.envs),
            agents,
            {agent: first.observation_space(agent) for agent in agents},
            {agent: first.action_space(agent) for agent in agents},
            on_env_error=on_env_error,
            max_restarts=max_restarts,
        )

    def _set_max_episode_steps(self, value: int | None) -> None:
        for episode_copy in self._copies:
            episode_copy.max_episode_steps = value

    def reset(self) -> dict[AgentID, ObsArray]:  # type: ignore[override]
        results = [
            self._resolve_reset(idx, reset_copy(self._copies[idx], self._seeds[idx], self._options[idx], keep_error=True))
            for idx in range(self.num_envs)
        ]
        return self._collect_reset(results)

    @staticmethod
    def _make_copy(env: Any, max_episode_steps: int | None) -> EpisodeCopy:
        """One copy of a new env (at the start and at a restart)."""
        return parallel_copy(env, max_episode_steps)

    def _check_actions(self, per_copy: list[dict[AgentID, Any]]) -> None:
        """Refuse the actions before any copy steps (nothing to refuse here)."""

    def _wait_agents(self) -> MultiAgentStep:
        assert self._actions is not None, "step_async must be called before step_agents or step_wait"
        per_copy = self._split_actions(self._actions)
        self._actions = None
        self._check_actions(per_copy)
        return self._collect_step(
            [
                self._resolve_step(idx, step_copy(self._copies[idx], actions, keep_error=True))
                for idx, actions in enumerate(per_copy)
            ]
        )

    def _rebuild(self, env_idx: int, seed: int | None) -> tuple[dict, dict, dict] | CopyFailure:
        outcome = rebuild_copy(self._copies, self._env_fns, env_idx, seed, keep_error=True, make_copy=self._make_copy)
        self.envs[env_idx] = self._copies[env_idx].env
        return outcome

    def close(self) -> None:
        for env in self.envs:
            env.close()

    def get_attr(self, attr_name: str, indices: VecEnvIndices = None) -> list[Any]:
        return [getattr(self.envs[idx].unwrapped, attr_name) for idx in self._get_indices(indices)]

    def set_attr(self, attr_name: str, value: Any, indices: VecEnvIndices = None) -> None:
        for idx in self._get_indices(indices):
            setattr(self.envs[idx].unwrapped, attr_name, value)

    def env_method(self, method_name: str, *method_args, indices: VecEnvIndices = None, **method_kwargs) -> list[Any]:
        return [
            getattr(self.envs[idx].unwrapped, method_name)(*method_args, **method_kwargs) for idx in self._get_indices(indices)
        ]
