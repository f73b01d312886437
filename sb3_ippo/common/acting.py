"""Acting with a model outside ``learn`` as collection acts (DESIGN.md, "One way to act"): each agent's recurrent state
carried in each env copy from that agent's own first step, reset at its own episode end, zeros for an agent that joins
mid-episode.

- :class:`CarriedStates` keeps the states, as ``predict`` takes and returns them, for ``n_envs`` env copies: an agent's
  state advances only in the copies where it acts, and a copy's states are zeroed when its episode ends.
- :func:`predict_agent` is one agent's ``predict`` of a multi-agent model, with that agent's state.
- :class:`CarryingModel` is a model for SB3's evaluation loop on a ``MultiAgentVecEnv``: its ``predict`` acts for the
  agents alive in each copy only, from the states it carries.

Evaluation (``evaluate_policy``, ``MultiAgentEvalCallback``, the command line's ``evaluate`` and ``--video``), games
and frozen opponents (self-play snapshots included) act through these. A model without recurrent agents is called as
it always was: ``predict`` gets no state, and SB3's loop gets the model itself.

The vectorized env never brings an agent back within an episode: an agent that terminated or was truncated acts again
only after its copy has reset. So zeroing a copy's states when its episode ends zeroes each agent's at its own episode
end, as collection does (``MultiAgentOnPolicyAlgorithm._end_recurrent_episodes``), and an agent that joins late finds
its state at zeros, never advanced while it was absent.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

import numpy as np
from stable_baselines3.common.vec_env import VecEnv

from sb3_ippo.update.recurrent import PredictState, is_recurrent
from sb3_ippo.common.type_aliases import AgentID, ObsArray
from sb3_ippo.vec_env import MultiAgentVecEnv

# predict(agent, observations of some copies, their states or None) -> (actions, next states or None)
AgentPredict = Callable[[AgentID, ObsArray, PredictState | None], tuple[Any, PredictState | None]]


def select_rows(obs: ObsArray, rows: np.ndarray) -> ObsArray:
    """The rows ``rows`` (a bool mask or indices) of batched observations (a dict of arrays for Dict observations)."""
    if isinstance(obs, dict):
        return {key: value[rows] for key, value in obs.items()}
    return obs[rows]


def has_recurrent_agents(model: Any) -> bool:
    """Whether ``model`` (an IPPO model, or anything with ``policies``) has an agent with a recurrent policy."""
    policies = getattr(model, "policies", None)
    return isinstance(policies, Mapping) and any(is_recurrent(policy) for policy in policies.values())


def predict_agent(
    model: Any, agent: AgentID, obs: ObsArray, state: PredictState | None, deterministic: bool
) -> tuple[np.ndarray, PredictState | None]:
    """``agent``'s actions for the batched observations ``obs`` from a multi-agent model's ``predict`` (``{agent_id:
    obs}`` in, ``{agent_id: action}`` out), and its next state (None for a feed-forward agent).

    :param state: The agent's state for these rows; None: zeros, and ``predict`` is called without a state, as for any
        model whose ``predict`` takes only observations.
    """
    if state is None:
        actions, states = model.predict({agent: obs}, deterministic=deterministic)
    else:
        actions, states = model.predict({agent: obs}, state={agent: state}, deterministic=deterministic)
    return np.asarray(actions[agent]), None if not states else states.get(agent)


class CarriedStates:
    """Each agent's recurrent state in each of ``n_envs`` env copies, as ``predict`` takes and returns it (a tuple of
    arrays ``(n_layers, n_copies, hidden)``), carried as collection carries it: zeros until the agent first acts in a
    copy, advanced only where it acts, zeroed when the copy's episode ends (:meth:`end_episodes`).

    An agent whose ``predict`` returns no state (a feed-forward policy, a random or scripted player) keeps none.
    """

    def __init__(self, n_envs: int) -> None:
        self.n_envs = n_envs
        self.states: dict[AgentID, PredictState] = {}

    def act(self, predict: AgentPredict, agent: AgentID, rows: np.ndarray, obs: ObsArray) -> np.ndarray:
        """``agent``'s actions in the copies ``rows`` (a bool mask over the copies), from its observations of every
        copy ``obs``: ``predict(agent, observations of those copies, their states or None)``, whose next states are
        kept for those copies only."""
        carried = self.states.get(agent)
        state = None if carried is None else tuple(part[:, rows] for part in carried)
        actions, next_state = predict(agent, select_rows(obs, rows), state)
        if next_state is not None:
            if carried is None:
                carried = tuple(np.zeros((part.shape[0], self.n_envs, *part.shape[2:]), part.dtype) for part in next_state)
                self.states[agent] = carried
            for whole, part in zip(carried, next_state, strict=True):
                whole[:, rows] = part
        return np.asarray(actions)

    def end_episodes(self, copies: np.ndarray) -> None:
        """Zero every agent's state in ``copies`` (a bool mask over the copies): their episodes ended."""
        for carried in self.states.values():
            for part in carried:
                part[:, copies] = 0.0


class CarryingModel:
    """``model`` for SB3's evaluation loop on a ``MultiAgentVecEnv`` (``env``, bare or inside SB3 ``VecEnvWrapper``\\s):
    its ``predict`` acts, as collection does, only for the agents alive in each copy (the env's ``alive``), from the
    states it carries for them (:class:`CarriedStates`), which it returns as the ``state`` SB3 hands back. The loop's
    ``episode_start`` (a copy's episode ended) zeroes that copy's states. Every other attribute is the model's.

    The rows of an agent that is not alive in a copy get zero actions, which the env ignores.
    """

    def __init__(self, model: Any, env: VecEnv) -> None:
        self.model = model
        vec_env = env.unwrapped
        assert isinstance(vec_env, MultiAgentVecEnv), f"evaluation steps a MultiAgentVecEnv, got {vec_env!r}"
        self.env = vec_env

    def __getattr__(self, name: str) -> Any:
        if name == "model":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.model, name)

    def predict(
        self,
        observation: Mapping[AgentID, ObsArray],
        state: CarriedStates | None = None,
        episode_start: np.ndarray | None = None,
        deterministic: bool = False,
    ) -> tuple[dict[AgentID, np.ndarray], CarriedStates]:
        n_envs = self.env.num_envs
        carried = state if isinstance(state, CarriedStates) else CarriedStates(n_envs)
        if episode_start is not None:
            carried.end_episodes(np.asarray(episode_start, dtype=bool))
        alive = self.env.alive
        actions: dict[AgentID, np.ndarray] = {}
        for agent, obs in observation.items():
            rows = alive[agent]
            if not rows.any():
                continue
            moves = carried.act(self._predict_agent(deterministic), agent, rows, obs)
            shape = self.env.action_spaces[agent].shape or ()
            actions[agent] = np.zeros((n_envs, *shape), dtype=moves.dtype)
            actions[agent][rows] = moves.reshape(int(rows.sum()), *shape)
        return actions, carried

    def _predict_agent(self, deterministic: bool) -> AgentPredict:
        return lambda agent, obs, state: predict_agent(self.model, agent, obs, state, deterministic)


def acting_model(model: Any, env: VecEnv) -> Any:
    """What SB3's evaluation loop should step ``env`` with: a :class:`CarryingModel` of a model with recurrent agents,
    else the model itself (its ``predict`` is called as it always was)."""
    return CarryingModel(model, env) if has_recurrent_agents(model) else model
