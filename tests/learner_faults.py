"""A policy that fails only in the learner process, for ``async_training`` failure tests (importable by the spawned
learner, which unpickles it)."""

from __future__ import annotations

import multiprocessing
from typing import Any

from stable_baselines3.common.policies import ActorCriticPolicy


class FailsInLearnerPolicy(ActorCriticPolicy):
    """Acts normally in the main process; in a child process (the learner), evaluating actions raises."""

    def evaluate_actions(self, *args: Any, **kwargs: Any) -> Any:
        if multiprocessing.parent_process() is not None:
            raise RuntimeError("update failed in the learner (FailsInLearnerPolicy)")
        return super().evaluate_actions(*args, **kwargs)
