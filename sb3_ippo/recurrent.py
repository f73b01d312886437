"""Recurrent policies per agent: sb3-contrib's ``RecurrentActorCriticPolicy`` (``MlpLstmPolicy`` and its kin).

A recurrent agent's network carries a hidden state from step to step. This module holds what that changes outside the
update (:mod:`sb3_ippo.update.recurrent` holds the update on whole sequences):

- the policy aliases IPPO accepts (sb3-contrib's names, as ``RecurrentPPO`` takes them);
- the layout of one copy's hidden state as one array ``(4, n_lstm_layers, lstm_hidden_size)``: the actor's LSTM
  hidden and cell states, then the critic's (:func:`states_to_array`, :func:`array_to_states`), which is what a
  trajectory keeps as its ``initial_state``;
- ``predict`` per agent with SB3's recurrent convention (:func:`predict_recurrent`).

Collection (:class:`sb3_ippo.update.recurrent.RecurrentGroupRunner`) keeps each agent's state in every env copy,
advances it only where the agent acted, and zeroes it where the agent's own episode ended (it terminated, was
truncated, or the copy's episode ended), so that an agent that dies, or joins mid-episode, starts from zeros as its
trajectory does when the update re-runs the network over it.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

import numpy as np
import torch as th
from sb3_contrib.common.recurrent.policies import (
    RecurrentActorCriticCnnPolicy,
    RecurrentActorCriticPolicy,
    RecurrentMultiInputActorCriticPolicy,
)
from sb3_contrib.common.recurrent.type_aliases import RNNStates
from stable_baselines3.common.policies import BasePolicy

from sb3_ippo.types import AgentID

MlpLstmPolicy = RecurrentActorCriticPolicy
CnnLstmPolicy = RecurrentActorCriticCnnPolicy
MultiInputLstmPolicy = RecurrentMultiInputActorCriticPolicy

# sb3-contrib's names for its recurrent policies (RecurrentPPO.policy_aliases).
RECURRENT_POLICY_ALIASES: dict[str, type[BasePolicy]] = {
    "MlpLstmPolicy": MlpLstmPolicy,
    "CnnLstmPolicy": CnnLstmPolicy,
    "MultiInputLstmPolicy": MultiInputLstmPolicy,
}

# A recurrent agent's state as predict takes and returns it: the actor's LSTM (hidden, cell), each
# (n_lstm_layers, n_rows, lstm_hidden_size), as sb3-contrib's RecurrentPPO.predict does.
PredictState = tuple[np.ndarray, ...]


def is_recurrent(policy: Any) -> bool:
    """Whether ``policy`` (an instance or a class) is one of sb3-contrib's recurrent policies."""
    cls = policy if isinstance(policy, type) else type(policy)
    return issubclass(cls, RecurrentActorCriticPolicy)


def state_shape(policy: RecurrentActorCriticPolicy) -> tuple[int, int, int]:
    """One copy's hidden state as an array: ``(4, n_lstm_layers, lstm_hidden_size)`` (actor h, c, critic h, c)."""
    lstm = policy.lstm_actor
    return (4, lstm.num_layers, lstm.hidden_size)


def zero_states(policy: RecurrentActorCriticPolicy, n_rows: int) -> th.Tensor:
    """``n_rows`` zero states, ``(n_rows, 4, n_lstm_layers, lstm_hidden_size)``, on the policy's device."""
    return th.zeros((n_rows, *state_shape(policy)), device=policy.device)


def states_to_array(states: RNNStates) -> th.Tensor:
    """sb3-contrib's ``RNNStates`` (each tensor ``(n_layers, n_rows, hidden)``) as ``(n_rows, 4, n_layers, hidden)``."""
    return th.stack([states.pi[0], states.pi[1], states.vf[0], states.vf[1]]).permute(2, 0, 1, 3)


def array_to_states(states: th.Tensor) -> RNNStates:
    """The inverse of :func:`states_to_array`: ``(n_rows, 4, n_layers, hidden)`` as ``RNNStates``."""
    layers = states.permute(1, 2, 0, 3).contiguous()
    return RNNStates((layers[0], layers[1]), (layers[2], layers[3]))


def _episode_starts(episode_start: Any, agent: AgentID, n_rows: int | None) -> np.ndarray | None:
    if episode_start is None:
        return None
    starts = episode_start[agent] if isinstance(episode_start, Mapping) else episode_start
    starts = np.asarray(starts, dtype=bool).reshape(-1)
    if n_rows is not None and len(starts) != n_rows:
        raise ValueError(
            f"Agent {agent!r}: episode_start has {len(starts)} entries for {n_rows} observations; give one per "
            "observation (an array, or a dict {agent_id: array})"
        )
    return starts


def check_predict_state(state: Any) -> None:
    """:raises ValueError: for a ``state`` that is neither None nor a dict of agents' states."""
    if state is not None and not isinstance(state, Mapping):
        raise ValueError(
            "A model with recurrent agents takes state={agent_id: (hidden, cell)}, as its predict returned it, or None "
            f"at the start; got {type(state).__name__}"
        )


def check_episode_start(episode_start: Any, recurrent_agents: Iterable[AgentID]) -> None:
    """:raises ValueError: for an ``episode_start`` dict without an entry for one of the ``recurrent_agents`` given."""
    if not isinstance(episode_start, Mapping):
        return
    for agent in recurrent_agents:
        if agent not in episode_start:
            raise ValueError(
                f"episode_start has no entry for agent {agent!r}, whose policy is recurrent: give {{agent_id: array}} "
                f"with one array (one bool per observation row) for each recurrent agent observed, or one array for "
                f"every agent; episode_start has {sorted(episode_start, key=str)}"
            )


def predict_recurrent(
    policy: RecurrentActorCriticPolicy,
    agent: AgentID,
    observation: Any,
    state: Mapping[AgentID, PredictState] | None,
    episode_start: Any,
    deterministic: bool,
) -> tuple[np.ndarray, PredictState]:
    """One recurrent agent's ``predict``, as ``RecurrentPPO.predict``: ``state[agent]`` (absent: zeros) and
    ``episode_start`` (an array, one per observation row, or ``{agent_id: array}``; None: no episode starts) in, the
    action and the agent's next state out.

    ``state`` is checked first (:func:`check_predict_state`).
    """
    agent_state = None if state is None else state.get(agent)
    n_rows = None if agent_state is None else int(np.shape(agent_state[0])[1])
    return policy.predict(  # type: ignore[return-value]
        observation, agent_state, _episode_starts(episode_start, agent, n_rows), deterministic
    )
