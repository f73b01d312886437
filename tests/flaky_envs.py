"""Test envs that fail: for the env layer's restarts (``make_vec_env(..., on_env_error="restart")``).

Each env counts its own steps and resets over its lifetime, so that a copy rebuilt from the factory (a fresh
instance) starts counting again; ``failures`` lists when to fail.
"""

from __future__ import annotations

import os
import signal
import time
from typing import Any

from tests.envs import DyingAgentsEnv

AgentID = str


class FlakyEnv(DyingAgentsEnv):
    """A :class:`DyingAgentsEnv` of two agents that stay ``max_steps`` steps, failing on purpose.

    Observation ``[t / max_steps, target]``: ``t * max_steps`` recovers the step within the episode, which tells
    whether a trajectory is one unbroken piece of one episode.

    :param fail_at_step: Fail (see ``how``) in the ``fail_at_step``-th ``step`` call of this instance's life (and every
        ``fail_every`` calls after it, if set).
    :param fail_at_reset: Raise in the ``fail_at_reset``-th ``reset`` call of this instance's life.
    :param only_seeds: Fail only if the first reset of this instance had one of these seeds (None: whatever the seed):
        this picks the copies that fail (copy ``i`` of ``make_vec_env(..., seed=s)`` first gets ``s + i``) and lets a
        rebuilt copy, reseeded, run without failing.
    :param how: "raise" an exception, "exit": end the process (as a crashing simulator would), or "interrupt": send
        SIGINT (Ctrl-C) to the process ``interrupt_pid`` 0.2 s into the step, then finish the step as usual (in a
        worker process: Ctrl-C strikes while the parent waits for this step, however loaded the machine is).
    :param interrupt_pid: The process that ``how="interrupt"`` interrupts.
    :param step_seconds: Sleep this long in every step (a slow simulator).
    """

    def __init__(
        self,
        fail_at_step: int | None = None,
        fail_every: int | None = None,
        fail_at_reset: int | None = None,
        only_seeds: tuple[int, ...] | None = None,
        how: str = "raise",
        max_steps: int = 6,
        step_seconds: float = 0.0,
        interrupt_pid: int | None = None,
    ) -> None:
        super().__init__(death_steps={"agent_0": None, "agent_1": None}, max_steps=max_steps)
        self.fail_at_step = fail_at_step
        self.fail_every = fail_every
        self.fail_at_reset = fail_at_reset
        self.only_seeds = only_seeds
        self.how = how
        self.step_seconds = step_seconds
        self.interrupt_pid = interrupt_pid
        self.step_calls = 0
        self.reset_calls = 0
        self.reset_seeds: list[int | None] = []

    def _fail(self, what: str) -> None:
        if self.only_seeds is not None and self.reset_seeds[0] not in self.only_seeds:
            return
        if self.how == "exit":
            os._exit(3)
        if self.how == "interrupt":
            assert self.interrupt_pid is not None, "how='interrupt' needs interrupt_pid"
            time.sleep(0.2)
            os.kill(self.interrupt_pid, signal.SIGINT)
            return
        raise RuntimeError(f"FlakyEnv failed on purpose in {what}")

    def reset(self, seed: int | None = None, options: dict | None = None) -> tuple[dict, dict]:
        self.reset_calls += 1
        self.reset_seeds.append(seed)
        if self.reset_calls == self.fail_at_reset:
            self._fail(f"reset call {self.reset_calls}")
        return super().reset(seed, options)

    def step(self, actions: dict[AgentID, Any]) -> tuple[dict, dict, dict, dict, dict]:
        self.step_calls += 1
        if self.step_seconds:
            time.sleep(self.step_seconds)
        if self.fail_at_step is not None and (
            self.step_calls == self.fail_at_step
            or (
                self.fail_every is not None
                and self.step_calls > self.fail_at_step
                and (self.step_calls - self.fail_at_step) % self.fail_every == 0
            )
        ):
            self._fail(f"step call {self.step_calls}")
        return super().step(actions)
