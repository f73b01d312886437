"""Frozen seats: opponents that play some agents' moves and never train, and the self-play pool of snapshots.

``IPPO(..., opponents={"player_2": "random"})`` gives a seat to a fixed opponent: uniformly random among the legal
moves (``"random"``), any model's ``predict`` (an IPPO model, a ``PPO`` or ``MaskablePPO``, a policy), or a
function of the observations. ``self_play_pool=dict(snapshot_every=K, size=M)`` keeps frozen copies of the learner's
policies, one every ``K`` updates, the last ``M`` of them; in each episode of each env copy one seat (drawn at
random) is played by a snapshot drawn from the pool, the usual guard against cycling in self-play.

Where a seat is frozen, the learner's policy does not act, and nothing is stored: frozen seats never train. Their
moves are part of the learners' environment: the rewards they cause reach the learners' last moves
(:mod:`sb3_ippo.games.turn_based`). A recurrent opponent or snapshot remembers as a learner does: its state is carried
per seat and env copy from the seat's first move of the episode (:class:`sb3_ippo.common.acting.CarriedStates`).
"""

from __future__ import annotations

import inspect
import itertools
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np
from gymnasium import spaces

from sb3_ippo.common.acting import CarriedStates, predict_agent
from sb3_ippo.games.masking import MASK_KEY, split_mask
from sb3_ippo.common.preprocessing import to_env_action
from sb3_ippo.update.recurrent import PredictState
from sb3_ippo.common.type_aliases import AgentID, ObsArray

RANDOM = "random"


class Opponent:
    """Plays one or more seats: ``act(agent, obs)`` gives an action for each row of ``obs`` (batched observations
    of the seat ``agent``, as the env gives them, action masks included).

    Frozen seats call :meth:`predict`, which also takes and returns the rows' recurrent states (SB3's recurrent
    convention); an opponent without memory needs only ``act``.
    """

    def act(self, agent: AgentID, obs: ObsArray) -> np.ndarray:
        raise NotImplementedError

    def predict(
        self, agent: AgentID, obs: ObsArray, state: PredictState | None = None
    ) -> tuple[np.ndarray, PredictState | None]:
        """The actions for the rows of ``obs`` and their next states: ``state`` is the rows' states as the previous
        call returned them (None: zeros, the start of the seat's episode). Without memory: ``(act(agent, obs), None)``."""
        return self.act(agent, obs), None


class RandomOpponent(Opponent):
    """Uniformly random among the legal moves (those its ``action_mask`` allows), or over the action space when the
    observation has no mask.

    :param action_spaces: The seats' action spaces.
    :param seed: Seed of its own generator (None: drawn from NumPy's global generator, so that SB3's
        ``set_random_seed``, which a model's ``seed`` calls, makes its moves reproducible too).
    """

    def __init__(self, action_spaces: Mapping[AgentID, spaces.Space], seed: int | None = None) -> None:
        self.action_spaces = dict(action_spaces)
        self.rng = np.random.default_rng(seed if seed is not None else np.random.randint(2**31))

    def act(self, agent: AgentID, obs: ObsArray) -> np.ndarray:
        space = self.action_spaces[agent]
        if isinstance(obs, dict) and MASK_KEY in obs:
            return self._legal(agent, space, np.asarray(obs[MASK_KEY]).reshape(len(obs[MASK_KEY]), -1).astype(bool))
        n_rows = len(next(iter(obs.values()))) if isinstance(obs, dict) else len(obs)
        return self._any(space, n_rows)

    def _uniform(self, mask: np.ndarray, agent: AgentID) -> np.ndarray:
        """For each row, the index of a True entry of ``mask`` drawn uniformly."""
        counts = mask.sum(axis=1)
        if np.any(counts == 0):
            raise ValueError(f"Agent {agent!r}'s action_mask allows no move at all; a random opponent cannot play it")
        threshold = self.rng.random(len(mask)) * counts
        return np.argmax(np.cumsum(mask, axis=1) > threshold[:, None], axis=1)

    def _legal(self, agent: AgentID, space: spaces.Space, mask: np.ndarray) -> np.ndarray:
        if isinstance(space, spaces.Discrete):
            return self._uniform(mask, agent) + int(space.start)
        shape = space.shape or ()
        sizes = space.nvec.reshape(-1) if isinstance(space, spaces.MultiDiscrete) else np.full(int(np.prod(shape)), 2)
        bounds = np.concatenate([[0], np.cumsum(sizes)])
        choices = [self._uniform(mask[:, start:end], agent) for start, end in itertools.pairwise(bounds)]
        indices = np.stack(choices, axis=1).reshape(len(mask), *shape)
        return to_env_action(indices, space).astype(space.dtype)

    def _any(self, space: spaces.Space, n_rows: int) -> np.ndarray:
        if isinstance(space, spaces.Discrete):
            return self.rng.integers(int(space.n), size=n_rows) + int(space.start)
        if isinstance(space, spaces.MultiDiscrete):
            return to_env_action((self.rng.random((n_rows, *space.shape)) * space.nvec).astype(np.int64), space).astype(
                space.dtype
            )
        if isinstance(space, spaces.MultiBinary):
            return self.rng.integers(2, size=(n_rows, *space.shape)).astype(space.dtype)
        if isinstance(space, spaces.Box):
            return self.rng.uniform(space.low, space.high, size=(n_rows, *space.shape)).astype(space.dtype)
        raise ValueError(f"A random opponent cannot play the action space {space}")


class ModelOpponent(Opponent):
    """Any model's ``predict``: an IPPO model (it plays the seat with its own policy for that agent id), a model or
    policy whose ``predict`` takes ``action_masks`` (sb3-contrib's ``MaskablePPO``: it gets the observation and the
    mask apart, as sb3-contrib expects), or any other SB3 model or policy (it gets the observation as the env gives it).

    :param deterministic: Whether the model plays its most likely moves (default: it samples, a more varied opponent).
    """

    def __init__(self, model: Any, deterministic: bool = False) -> None:
        self.model = model
        self.deterministic = deterministic
        self.multi_agent = hasattr(model, "possible_agents")
        self.takes_masks = "action_masks" in inspect.signature(model.predict).parameters

    def act(self, agent: AgentID, obs: ObsArray) -> np.ndarray:
        return self.predict(agent, obs)[0]

    def predict(
        self, agent: AgentID, obs: ObsArray, state: PredictState | None = None
    ) -> tuple[np.ndarray, PredictState | None]:
        """The model's ``predict`` for the seat, with the rows' states for a recurrent model (an IPPO model's recurrent
        agent, a ``RecurrentPPO``); a state of None is not passed, so a model without memory is called as always."""
        if self.multi_agent:
            if agent not in self.model.possible_agents:
                raise ValueError(
                    f"The opponent model has no policy for seat {agent!r}; its agents are {self.model.possible_agents}"
                )
            return predict_agent(self.model, agent, obs, state, self.deterministic)
        if self.takes_masks and isinstance(obs, dict) and MASK_KEY in obs:
            # sb3-contrib has no recurrent maskable policy: no state.
            observation, mask = split_mask(obs)
            actions, _ = self.model.predict(observation, deterministic=self.deterministic, action_masks=mask)
            return np.asarray(actions), None
        kwargs: dict[str, Any] = {} if state is None else {"state": state}
        actions, next_state = self.model.predict(obs, deterministic=self.deterministic, **kwargs)
        return np.asarray(actions), next_state


class CallableOpponent(Opponent):
    """A function ``fn(obs) -> actions`` of the batched observations of the rows where the seat is to move (arrays
    with a leading row axis, a dict of them for Dict observations), returning one action per row."""

    def __init__(self, fn: Callable[[ObsArray], Any]) -> None:
        self.fn = fn

    def act(self, agent: AgentID, obs: ObsArray) -> np.ndarray:
        return np.asarray(self.fn(obs))


class SnapshotOpponent(Opponent):
    """A frozen copy of learner policies (``{agent: policy}``) with the observation preprocessing of their time."""

    def __init__(self, policies: Mapping[AgentID, Any], preprocess: Mapping[AgentID, Callable[[ObsArray], ObsArray]]):
        self.policies = dict(policies)
        self.preprocess = dict(preprocess)

    def act(self, agent: AgentID, obs: ObsArray) -> np.ndarray:
        return self.predict(agent, obs)[0]

    def predict(
        self, agent: AgentID, obs: ObsArray, state: PredictState | None = None
    ) -> tuple[np.ndarray, PredictState | None]:
        """The frozen policy's sampled actions, and for a recurrent policy the rows' next states."""
        policy = self.policies[agent]
        actions, next_state = policy.predict(self.preprocess[agent](obs), state, deterministic=False)
        return np.asarray(to_env_action(actions, policy.action_space)), next_state


def make_opponent(spec: Any, action_spaces: Mapping[AgentID, spaces.Space], seed: int | None = None) -> Opponent:
    """An :class:`Opponent` from what a user gives: ``"random"``, an :class:`Opponent`, anything with ``predict``,
    or a function of the batched observations.

    :raises ValueError: for anything else, saying what is accepted.
    """
    if isinstance(spec, Opponent):
        return spec
    if isinstance(spec, str):
        if spec != RANDOM:
            raise ValueError(f"Unknown opponent {spec!r}: the built-in opponent is {RANDOM!r} (uniform among legal moves)")
        return RandomOpponent(action_spaces, seed)
    if callable(getattr(spec, "predict", None)):
        return ModelOpponent(spec)
    if callable(spec):
        return CallableOpponent(spec)
    raise ValueError(
        f"An opponent must be {RANDOM!r}, a model or policy with predict(), or a function of the observations; got {spec!r}"
    )


class SelfPlayPool:
    """The last ``size`` snapshots of the learner, one taken every ``snapshot_every`` updates (and one at the start).

    :raises ValueError: for settings other than two positive integers ``snapshot_every`` and ``size``.
    """

    def __init__(self, snapshot_every: int, size: int) -> None:
        for name, value in (("snapshot_every", snapshot_every), ("size", size)):
            if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
                raise ValueError(f"self_play_pool[{name!r}] must be a positive integer, got {value!r}")
        self.snapshot_every = int(snapshot_every)
        self.size = int(size)
        self.snapshots: deque[SnapshotOpponent] = deque(maxlen=self.size)
        self.versions: deque[int] = deque(maxlen=self.size)

    @classmethod
    def from_settings(cls, settings: Mapping[str, Any]) -> SelfPlayPool:
        if not isinstance(settings, Mapping):
            raise ValueError(f"self_play_pool must be a dict(snapshot_every=K, size=M), got {settings!r}")
        unknown = sorted(set(settings) - {"snapshot_every", "size"})
        missing = sorted({"snapshot_every", "size"} - set(settings))
        if unknown or missing:
            raise ValueError(
                f"self_play_pool takes dict(snapshot_every=K, size=M); unknown keys {unknown}, missing keys {missing}"
            )
        return cls(settings["snapshot_every"], settings["size"])

    def add(self, version: int, snapshot: SnapshotOpponent) -> None:
        self.snapshots.append(snapshot)
        self.versions.append(version)

    def draw(self, rng: np.random.Generator) -> SnapshotOpponent:
        return self.snapshots[int(rng.integers(len(self.snapshots)))]


class FrozenSeats:
    """Which seats of which env copies frozen opponents play in the current episode, and their moves.

    :param possible_agents: The env's agents.
    :param opponents: ``{seat: opponent}``: seats a fixed opponent always plays.
    :param pool: The self-play pool, or None. Each episode of each copy, one of the other seats (drawn uniformly) is
        played by a snapshot drawn uniformly from the pool.
    :param take_snapshot: Makes a snapshot of the current learner (called for the pool's first snapshot, lazily, so
        that a loaded model's weights are the ones frozen).
    :param seed: Seed of the draws (None: unseeded).
    :raises ValueError: for an unknown seat, or settings that would leave no seat to learn.
    """

    def __init__(
        self,
        possible_agents: Sequence[AgentID],
        opponents: Mapping[AgentID, Opponent],
        pool: SelfPlayPool | None = None,
        take_snapshot: Callable[[], SnapshotOpponent] | None = None,
        seed: int | None = None,
    ) -> None:
        unknown = [seat for seat in opponents if seat not in possible_agents]
        if unknown:
            raise ValueError(
                f"opponents names seats {unknown} that the env does not have; its agents are {list(possible_agents)}"
            )
        self.possible_agents = list(possible_agents)
        self.opponents = dict(opponents)
        self.pool = pool
        self.pool_seats = [agent for agent in possible_agents if agent not in opponents]
        if not self.pool_seats:
            raise ValueError(f"opponents freezes every seat {list(possible_agents)}: leave at least one seat to learn")
        if pool is not None:
            if len(self.pool_seats) < 2:
                raise ValueError(
                    f"self_play_pool needs two seats that are not fixed opponents (one for a snapshot, one to learn); "
                    f"the free seats are {self.pool_seats}"
                )
            if take_snapshot is None:
                raise ValueError("a self-play pool needs take_snapshot")
        self.take_snapshot = take_snapshot
        self.rng = np.random.default_rng(seed)
        self._pool_seat: list[AgentID | None] = []
        self._pool_player: list[SnapshotOpponent | None] = []
        # The frozen players' recurrent states, per seat and env copy: one player per seat and copy in an episode.
        self._states: CarriedStates | None = None

    def _ensure(self, n_envs: int) -> None:
        if len(self._pool_seat) != n_envs:
            self._pool_seat = [None] * n_envs
            self._pool_player = [None] * n_envs
            self.start_episodes(np.ones(n_envs, dtype=bool))

    def start_episodes(self, copies: np.ndarray) -> None:
        """Zero the frozen players' states in ``copies`` (a bool mask over the copies), whose episodes ended, and draw
        the pool's seat and snapshot for their new episodes."""
        if self._states is not None and len(copies) == self._states.n_envs:
            self._states.end_episodes(copies)
        if self.pool is None:
            return
        if not self.pool.snapshots:
            assert self.take_snapshot is not None
            self.pool.add(0, self.take_snapshot())
        for env_idx in np.flatnonzero(copies).tolist():
            if env_idx >= len(self._pool_seat):
                continue
            self._pool_seat[env_idx] = self.pool_seats[int(self.rng.integers(len(self.pool_seats)))]
            self._pool_player[env_idx] = self.pool.draw(self.rng)

    def reset_states(self) -> None:
        """Forget the frozen players' states in every copy (the copies were reset)."""
        self._states = None

    def after_update(self, policy_version: int) -> None:
        """Add a snapshot of the learner to the pool every ``snapshot_every`` versions."""
        if self.pool is not None and policy_version % self.pool.snapshot_every == 0:
            assert self.take_snapshot is not None
            self.pool.add(policy_version, self.take_snapshot())

    def frozen(self, agent: AgentID, n_envs: int) -> np.ndarray:
        """``(n_envs,)``: the copies where ``agent``'s seat is frozen in the current episode."""
        if agent in self.opponents:
            return np.ones(n_envs, dtype=bool)
        self._ensure(n_envs)
        return np.array([seat == agent for seat in self._pool_seat], dtype=bool)

    def learning(self, alive: Mapping[AgentID, np.ndarray]) -> dict[AgentID, np.ndarray]:
        """Where each agent is alive and played by the learner."""
        return {agent: mask & ~self.frozen(agent, len(mask)) for agent, mask in alive.items()}

    def play(
        self,
        obs: Mapping[AgentID, ObsArray],
        alive: Mapping[AgentID, np.ndarray],
        actions: dict[AgentID, np.ndarray],
        action_spaces: Mapping[AgentID, spaces.Space],
    ) -> None:
        """Fill the frozen seats' rows of ``actions`` (in place; a copy of each array it changes) with their moves, each
        player acting from its states in those rows."""
        for agent, mask in alive.items():
            n_envs = len(mask)
            if self._states is None or self._states.n_envs != n_envs:
                self._states = CarriedStates(n_envs)
            rows = mask & self.frozen(agent, n_envs)
            if not rows.any():
                continue
            if agent in actions:
                actions[agent] = np.array(actions[agent], copy=True)
            else:
                space = action_spaces[agent]
                actions[agent] = np.zeros((n_envs, *(space.shape or ())), dtype=space.dtype)
            if agent in self.opponents:
                players: list[tuple[Opponent, np.ndarray]] = [(self.opponents[agent], rows)]
            else:
                by_snapshot: dict[int, tuple[Opponent, np.ndarray]] = {}
                for env_idx in np.flatnonzero(rows).tolist():
                    snapshot = self._pool_player[env_idx]
                    assert snapshot is not None
                    entry = by_snapshot.setdefault(id(snapshot), (snapshot, np.zeros(n_envs, dtype=bool)))
                    entry[1][env_idx] = True
                players = list(by_snapshot.values())
            for player, player_rows in players:
                moves = self._states.act(player.predict, agent, player_rows, obs[agent])
                actions[agent][player_rows] = np.asarray(moves).reshape(int(player_rows.sum()), *actions[agent].shape[1:])


def make_frozen_seats(
    possible_agents: Sequence[AgentID],
    action_spaces: Mapping[AgentID, spaces.Space],
    opponents: Mapping[AgentID, Any] | None,
    self_play_pool: Mapping[str, Any] | None,
    take_snapshot: Callable[[], SnapshotOpponent],
    seed: int | None = None,
) -> FrozenSeats | None:
    """IPPO's frozen seats from its ``opponents`` and ``self_play_pool`` settings; None when there are none.

    :raises ValueError: for an opponent, seat or pool setting that is not valid, saying what is expected.
    """
    if not opponents and self_play_pool is None:
        return None
    if opponents is not None and not isinstance(opponents, Mapping):
        raise ValueError(f"opponents must be a dict {{agent id: opponent}}, e.g. {{'player_2': 'random'}}; got {opponents!r}")
    seeds = np.random.SeedSequence(seed).spawn(len(opponents or {}) + 1) if seed is not None else None
    players = {
        seat: make_opponent(spec, action_spaces, None if seeds is None else int(seeds[index].generate_state(1)[0]))
        for index, (seat, spec) in enumerate((opponents or {}).items())
    }
    pool = None if self_play_pool is None else SelfPlayPool.from_settings(self_play_pool)
    draw_seed = None if seeds is None else int(seeds[-1].generate_state(1)[0])
    return FrozenSeats(possible_agents, players, pool, take_snapshot, draw_seed)
