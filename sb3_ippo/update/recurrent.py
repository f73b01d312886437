"""Recurrent policies per agent (sb3-contrib's ``RecurrentActorCriticPolicy``: ``MlpLstmPolicy`` and its kin): how they
act, and their update on whole sequences. Everything recurrence changes is in this module.

A recurrent agent's network carries a hidden state from step to step. Acting:

- the policy aliases IPPO accepts (sb3-contrib's names, as ``RecurrentPPO`` takes them);
- the layout of one copy's hidden state as one array ``(4, n_lstm_layers, lstm_hidden_size)``: the actor's LSTM
  hidden and cell states, then the critic's (:func:`states_to_array`, :func:`array_to_states`), which is what a
  trajectory keeps as its ``initial_state``;
- ``predict`` per agent with SB3's recurrent convention (:func:`predict_recurrent`);
- collection (:class:`RecurrentGroupRunner`) keeps each agent's state in every env copy, advances it only where the
  agent acted, and zeroes it where the agent's own episode ended (it terminated, was truncated, or the copy's episode
  ended), so that an agent that dies, or joins mid-episode, starts from zeros as its trajectory does when the update
  re-runs the network over it.

The update: every drained trajectory is one sequence: a whole episode of the agent, or a chunk that ``rollout_len``
cut, which starts from the hidden state collection had carried to it (``Trajectory.initial_state``; zeros at an
episode start).

- **Recompute** (:func:`build_sequence_batch`): the current network is re-run over each whole sequence from its
  initial state, with the bootstrap observation (of a truncated or cut trajectory) appended as one more step, so
  V(s_T) comes from the hidden state after the last step. Then fresh-value GAE as for feed-forward policies
  (:func:`sb3_ippo.update.batch.finish_batch`).
- **Update** (:func:`recurrent_ppo_update`): as :func:`sb3_ippo.update.ppo.ppo_update` (passes, KL stop, gradient
  clipping), but a minibatch is a set of whole sequences: consecutive sequences (shuffled as sequences with
  ``shuffle_minibatches``) until they hold ``batch_size`` transitions. The sequences are padded to the longest one
  for the LSTM, and only the real steps' outputs are taken into the loss: padded steps never reach it.

The LSTM runs over a padded sequence in one call (no reset inside a sequence, since a trajectory never spans two
episodes of its agent), as sb3-contrib's ``_process_sequence`` does when no episode starts inside.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch as th
from gymnasium import spaces
from sb3_contrib.common.recurrent.policies import (
    RecurrentActorCriticCnnPolicy,
    RecurrentActorCriticPolicy,
    RecurrentMultiInputActorCriticPolicy,
)
from sb3_contrib.common.recurrent.type_aliases import RNNStates
from stable_baselines3.common.policies import BasePolicy
from stable_baselines3.common.utils import obs_as_tensor

from sb3_ippo.common.buffer import Trajectory
from sb3_ippo.common.groups import AgentGroup
from sb3_ippo.common.normalization import ObservationNormalizer, ReturnNormalizer
from sb3_ippo.common.type_aliases import AgentID, ObsArray
from sb3_ippo.update.batch import AgentBatch, TensorObs, drain_to_tensors, finish_batch
from sb3_ippo.update.ppo import UpdateStats, _Losses, gradient_passes, surrogate_losses, update_stats
from sb3_ippo.update.runners import ActOutput, GroupRunner
from sb3_ippo.update.settings import UpdateSettings
from sb3_ippo.update.stacked import concat_tensor_obs

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


def _scatter_rows(rows: TensorObs, positions: th.Tensor, n_rows: int, into: TensorObs | None = None) -> TensorObs:
    """``rows`` placed at ``positions`` of ``into`` (or of a zero tensor of ``n_rows`` rows, its padding)."""
    if isinstance(rows, dict):
        target = into if isinstance(into, dict) else {key: None for key in rows}
        return {key: _scatter_rows(value, positions, n_rows, target[key]) for key, value in rows.items()}  # type: ignore[misc]
    if into is None:
        into = th.zeros((n_rows, *rows.shape[1:]), dtype=rows.dtype, device=rows.device)
    assert isinstance(into, th.Tensor)
    into[positions] = rows
    return into


def padded_rows(lengths: Sequence[int], max_len: int) -> list[int]:
    """The padded rows of the steps of each sequence, sequences padded to ``max_len`` steps and laid out one after another
    (sb3-contrib's layout: step ``t`` of sequence ``i`` is row ``i * max_len + t``)."""
    return [i * max_len + t for i, length in enumerate(lengths) for t in range(length)]


def evaluate_sequences(
    policy: RecurrentActorCriticPolicy, observations: TensorObs, actions: th.Tensor, initial_states: th.Tensor
) -> tuple[th.Tensor, th.Tensor, th.Tensor | None]:
    """The policy's values, log-probs and entropies (each one per padded row) over padded sequences laid out as
    :func:`padded_rows` says, each run from its state in ``initial_states`` ``(n_sequences, 4, layers, hidden)``. The
    LSTM runs over each sequence in one call: no episode starts inside a trajectory."""
    episode_starts = th.zeros(len(actions), device=actions.device)
    values, log_prob, entropy = policy.evaluate_actions(
        observations,  # type: ignore[arg-type]
        actions,
        array_to_states(initial_states),
        episode_starts,
    )
    return values.flatten(), log_prob, entropy


@dataclass
class SequenceBatch:
    """One recurrent agent's training batch: :class:`AgentBatch` (the sequences' rows end to end) plus where each
    sequence starts in it, its length, and its initial hidden state."""

    batch: AgentBatch
    starts: np.ndarray
    lengths: np.ndarray
    initial_states: th.Tensor

    def __len__(self) -> int:
        return len(self.batch)

    def rows(self, sequences: Sequence[int]) -> th.Tensor:
        """The batch rows of ``sequences``, sequence after sequence."""
        ranges = [np.arange(self.starts[i], self.starts[i] + self.lengths[i]) for i in sequences]
        return th.as_tensor(np.concatenate(ranges), dtype=th.long, device=self.batch.advantages.device)

    def evaluate(
        self, policy: RecurrentActorCriticPolicy, sequences: Sequence[int]
    ) -> tuple[AgentBatch, th.Tensor, th.Tensor, th.Tensor | None]:
        """``sequences``' rows (an :class:`AgentBatch`) and the policy's values, log-probs and entropies on them, the
        sequences run from their initial states, padded to the longest of them: padded steps are dropped."""
        rows = self.rows(sequences)
        minibatch = self.batch.select(rows)
        device = rows.device
        lengths = [int(self.lengths[i]) for i in sequences]
        max_len = max(lengths)
        valid = th.as_tensor(padded_rows(lengths, max_len), dtype=th.long, device=device)
        n_rows = len(lengths) * max_len
        observations = _scatter_rows(minibatch.observations, valid, n_rows)
        actions = _scatter_rows(minibatch.actions, valid, n_rows)
        assert isinstance(actions, th.Tensor)
        states = self.initial_states[th.as_tensor(list(sequences), dtype=th.long, device=device)]
        values, log_prob, entropy = evaluate_sequences(policy, observations, actions, states)
        # Only the real steps' outputs go on: the padded steps' never reach the loss.
        values, log_prob = values[valid], log_prob[valid]
        entropy = None if entropy is None else entropy[valid]
        return minibatch, values, log_prob, entropy


def initial_states_of(
    policy: RecurrentActorCriticPolicy, trajectories: Sequence[Trajectory]
) -> th.Tensor:
    """Each trajectory's initial hidden state, ``(n, 4, layers, hidden)`` (zeros where it kept none)."""
    states = zero_states(policy, len(trajectories))
    for i, trajectory in enumerate(trajectories):
        if trajectory.initial_state is not None:
            states[i] = th.as_tensor(trajectory.initial_state, device=states.device)
    return states


def build_sequence_batch(
    policy: RecurrentActorCriticPolicy,
    trajectories: Sequence[Trajectory],
    settings: UpdateSettings,
    preprocess_obs: Callable[[ObsArray], ObsArray] | None = None,
    return_normalizer: ReturnNormalizer | None = None,
) -> SequenceBatch:
    """:func:`sb3_ippo.update.batch.build_batch` for a recurrent policy: values and log-probs recomputed by re-running
    the current network over each whole sequence from its initial state, the bootstrap observation appended as one
    more step (see the module docstring)."""
    drained = drain_to_tensors(
        trajectories, policy.action_space, policy.device, preprocess_obs, settings.time_limit_bootstrap
    )
    device = drained.actions.device
    lengths = np.asarray(drained.lengths)
    # One more padded step after each bootstrapped trajectory's last: its bootstrap observation.
    bootstrapped = set(drained.bootstrapped)
    max_len = max(length + (i in bootstrapped) for i, length in enumerate(drained.lengths))
    n_rows = len(lengths) * max_len
    step_rows = th.as_tensor(padded_rows(drained.lengths, max_len), dtype=th.long, device=device)
    bootstrap_rows = th.as_tensor(
        [i * max_len + int(lengths[i]) for i in drained.bootstrapped], dtype=th.long, device=device
    )
    observations = _scatter_rows(drained.observations, step_rows, n_rows)
    if drained.bootstrap_obs is not None:
        observations = _scatter_rows(drained.bootstrap_obs, bootstrap_rows, n_rows, observations)
    actions = _scatter_rows(drained.actions, step_rows, n_rows)
    assert isinstance(actions, th.Tensor)
    initial_states = initial_states_of(policy, trajectories)
    with th.no_grad():
        values, log_prob, _ = evaluate_sequences(policy, observations, actions, initial_states)
    bootstrap_values = values[bootstrap_rows] if drained.bootstrapped else None
    batch = finish_batch(drained, values[step_rows], log_prob[step_rows], bootstrap_values, settings, return_normalizer)
    starts = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(int)
    return SequenceBatch(batch=batch, starts=starts, lengths=lengths, initial_states=initial_states)


def sequence_minibatches(lengths: np.ndarray, batch_size: int | None, order: Sequence[int]) -> list[list[int]]:
    """Sets of whole sequences, taken in ``order``, each closed once it holds at least ``batch_size`` transitions (None:
    one set of every sequence). A sequence longer than ``batch_size`` is a minibatch alone."""
    if batch_size is None:
        return [list(order)]
    minibatches: list[list[int]] = []
    current: list[int] = []
    size = 0
    for index in order:
        current.append(int(index))
        size += int(lengths[index])
        if size >= batch_size:
            minibatches.append(current)
            current, size = [], 0
    if current:
        minibatches.append(current)
    return minibatches


def _sequence_losses(
    policy: RecurrentActorCriticPolicy,
    batch: SequenceBatch,
    sequences: Sequence[int],
    advantages: th.Tensor,
    clip_range: float,
    clip_range_vf: float | None,
) -> _Losses:
    minibatch, values, log_prob, entropy = batch.evaluate(policy, sequences)
    return surrogate_losses(
        values, log_prob, entropy, minibatch, advantages[batch.rows(sequences)], clip_range, clip_range_vf
    )


def recurrent_ppo_update(
    policy: RecurrentActorCriticPolicy,
    batch: SequenceBatch,
    settings: UpdateSettings,
    generator: th.Generator | None = None,
) -> UpdateStats:
    """:func:`sb3_ippo.update.ppo.ppo_update` on whole sequences: largely identical (passes, advantage normalization
    over the batch, the KL stop ``after_step`` or ``before_step``, gradient clipping, the statistics), but each
    minibatch is a set of whole sequences (:func:`sequence_minibatches`; shuffled as sequences with
    ``shuffle_minibatches``), run from their initial states."""
    clip_range, clip_range_vf = settings.clip_range, settings.clip_range_vf
    assert not callable(clip_range) and not callable(clip_range_vf), "read the schedules first: UpdateSettings.at"
    advantages = batch.batch.advantages
    if settings.normalize_advantage and len(advantages) > 1:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    n_sequences = len(batch.lengths)
    everything = list(range(n_sequences))

    with th.no_grad():
        before = _sequence_losses(policy, batch, everything, advantages, clip_range, clip_range_vf)

    def epoch_losses() -> Iterator[_Losses]:
        order = th.randperm(n_sequences, generator=generator).tolist() if settings.shuffle_minibatches else everything
        for sequences in sequence_minibatches(batch.lengths, settings.batch_size, order):
            yield _sequence_losses(policy, batch, sequences, advantages, clip_range, clip_range_vf)

    policy.set_training_mode(True)
    n_epochs_run = gradient_passes(policy, settings, epoch_losses)
    policy.set_training_mode(False)
    with th.no_grad():
        after = _sequence_losses(policy, batch, everything, advantages, clip_range, clip_range_vf)
    return update_stats(before, after, batch.batch, n_epochs_run)


class RecurrentGroupRunner(GroupRunner):
    """The runner of a group whose policy is recurrent: it keeps every member's hidden state in each env copy during
    collection (``hidden_states``, rebuilt when the copies are: :meth:`reset_states`), and trains on whole sequences.

    Its members act one at a time, or all at once with ``share_parameters`` (one network, each member its own states);
    they are never stacked: whatever ``batched`` says, a group of several independent members takes the reference
    path (``batched=False``), which is what its results then equal. Silently, as masked groups do: ``batched=True`` is
    the default, and a default setting should not warn about a path that is the only one.
    """

    def __init__(
        self,
        group: AgentGroup,
        policies: Mapping[AgentID, Any],
        observation_spaces: Mapping[AgentID, spaces.Space],
        action_spaces: Mapping[AgentID, spaces.Space],
        batched: bool,
    ) -> None:
        super().__init__(group, policies, observation_spaces, action_spaces, batched=False)
        self.hidden_states: dict[AgentID, th.Tensor] = {}

    def __getstate__(self) -> dict[str, Any]:
        # Collection's hidden states stay with the collecting process.
        return {**super().__getstate__(), "hidden_states": {}}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.stacked = None

    def reset_states(self, n_envs: int) -> None:
        """Zero every member's hidden state in ``n_envs`` env copies (the copies were reset)."""
        self.hidden_states = {agent: zero_states(self.policies[agent], n_envs) for agent in self.agents}  # type: ignore[arg-type]

    def states_before_step(self, n_envs: int) -> dict[AgentID, np.ndarray]:
        """Every member's hidden states now, ``(n_envs, 4, layers, hidden)``: the initial state of the trajectories that
        open at the next step."""
        if not self.hidden_states or len(next(iter(self.hidden_states.values()))) != n_envs:
            self.reset_states(n_envs)
        # A copy: acting changes the states in place, and the tensor and its NumPy view share memory on the CPU.
        return {agent: states.cpu().numpy().copy() for agent, states in self.hidden_states.items()}

    def end_episodes(self, ended: Mapping[AgentID, np.ndarray]) -> None:
        """Zero each member's states in the copies where its episode ended (``ended[agent]``, one bool per copy)."""
        for agent, states in self.hidden_states.items():
            rows = th.as_tensor(ended[agent], dtype=th.bool, device=states.device)
            states[rows] = 0.0

    @th.no_grad()
    def act(
        self,
        obs: Mapping[AgentID, ObsArray],
        acting: Sequence[AgentID],
        obs_normalizers: Mapping[AgentID, ObservationNormalizer] | None,
        acted: Mapping[AgentID, np.ndarray] | None = None,
    ) -> dict[AgentID, ActOutput]:
        """As :meth:`GroupRunner.act`, from each member's hidden states; the states advance in the copies where the
        member acted (``acted[agent]``; None: every copy)."""
        members = [agent for agent in self.agents if agent in acting]
        if not members:
            return {}
        policy = self.policies[members[0]]
        inputs = [obs_as_tensor(self.policy_input(agent, obs[agent], obs_normalizers), policy.device) for agent in members]
        first = inputs[0]
        n_envs = len(next(iter(first.values())) if isinstance(first, dict) else first)
        if not self.hidden_states or len(self.hidden_states[members[0]]) != n_envs:
            self.reset_states(n_envs)
        if self.share_parameters:
            groups = [(members, concat_tensor_obs(inputs))]
        else:
            groups = [([agent], x) for agent, x in zip(members, inputs, strict=True)]
        outputs: dict[AgentID, ActOutput] = {}
        with self.members_noise(members):  # a shared gSDE policy explores with each member's matrices
            for agents, x in groups:
                net = self.policies[agents[0]]
                states = th.cat([self.hidden_states[agent] for agent in agents])
                starts = th.zeros(len(states), device=states.device)
                actions, values, log_probs, new_states = net(x, array_to_states(states), starts)  # type: ignore[call-arg]
                new = states_to_array(new_states)
                sizes = [len(self.hidden_states[agent]) for agent in agents]
                split = zip(actions.split(sizes), values.split(sizes), log_probs.split(sizes), new.split(sizes), strict=True)
                for agent, (agent_actions, agent_values, agent_log_probs, agent_states) in zip(agents, split, strict=True):
                    if acted is None:
                        self.hidden_states[agent] = agent_states.clone()
                    else:
                        keep = th.as_tensor(acted[agent], dtype=th.bool, device=states.device)
                        self.hidden_states[agent][keep] = agent_states[keep]
                    outputs[agent] = (agent_actions, agent_values, agent_log_probs)
        return outputs

    def update_member(
        self,
        agent: AgentID,
        trajectories: list[Trajectory],
        settings: UpdateSettings,
        preprocess: Callable[[ObsArray], ObsArray],
        return_normalizer: ReturnNormalizer | None,
        generator: th.Generator | None,
    ) -> UpdateStats:
        """As :meth:`GroupRunner.update_member`, on whole sequences (:func:`build_sequence_batch`,
        :func:`recurrent_ppo_update`); ``GroupRunner.update`` calls it (recurrent members are never stacked)."""
        policy = self.policies[agent]
        batch = build_sequence_batch(policy, trajectories, settings, preprocess, return_normalizer)  # type: ignore[arg-type]
        return recurrent_ppo_update(policy, batch, settings, generator)  # type: ignore[arg-type]


def make_group_runner(
    group: AgentGroup,
    policies: Mapping[AgentID, Any],
    observation_spaces: Mapping[AgentID, spaces.Space],
    action_spaces: Mapping[AgentID, spaces.Space],
    batched: bool,
) -> GroupRunner:
    """The runner of ``group``: a :class:`RecurrentGroupRunner` where its policy is recurrent, else a ``GroupRunner``."""
    runner_class = RecurrentGroupRunner if is_recurrent(policies[group.agents[0]]) else GroupRunner
    return runner_class(group, policies, observation_spaces, action_spaces, batched)
