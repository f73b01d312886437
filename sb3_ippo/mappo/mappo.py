"""MAPPO: IPPO's per-agent actors with a centralized critic, which sees the global state (or every agent's observation)
during training only."""

from __future__ import annotations

import io
import pathlib
from collections.abc import Mapping
from typing import Any, ClassVar, TypeVar

import numpy as np
import torch as th
from gymnasium import spaces
from stable_baselines3.common.policies import ActorCriticPolicy, BasePolicy

from sb3_ippo.common.checks import check_env_matches
from sb3_ippo.common.critic_input import (
    CRITIC_KEY,
    OBS_KEY,
    CriticInput,
    CriticInputKind,
    CriticInputWrapper,
    has_critic_input,
)
from sb3_ippo.ippo import IPPO
from sb3_ippo.mappo.export import export_actor
from sb3_ippo.mappo.policies import CentralCriticPolicy
from sb3_ippo.update.recurrent import PredictState
from sb3_ippo.common.type_aliases import AgentID
from sb3_ippo.vec_env import MultiAgentVecEnv, as_multiagent_vec_env, to_parallel_env
from sb3_ippo.games.turn_based import needs_turns

SelfMAPPO = TypeVar("SelfMAPPO", bound="MAPPO")


def critic_input_vec_env(env: Any, critic_input: CriticInput) -> MultiAgentVecEnv:
    """``env`` as a vectorized env whose agents observe ``{"obs": own, "critic": critic input}``.

    :param env: A PettingZoo parallel env (or an AEC env PettingZoo can run in parallel), or the result of
        ``make_vec_env(env_fn, ..., critic_input=...)`` with the same critic input.
    :raises ValueError: for a vectorized env made without that critic input, or a turn-based game; what to pass instead.
    """
    if isinstance(env, MultiAgentVecEnv):
        made_with = getattr(env, "critic_input", None)
        if made_with != critic_input:
            raise ValueError(
                f"MAPPO's critic input is {critic_input}, but this vectorized env was made with critic_input={made_with}: "
                "its copies must compute the critic input themselves. Make it with "
                f"make_vec_env(env_fn, n_envs, critic_input=CriticInput({critic_input.kind!r}, own_obs="
                f"{critic_input.own_obs}, agent_id={critic_input.agent_id})) (or critic_input={critic_input.kind!r} for "
                "the defaults), or pass MAPPO a single PettingZoo env."
            )
        return env
    if env is not None and needs_turns(env):
        raise ValueError(
            "MAPPO does not train turn-based games (an AEC env stepped turn by turn) yet: use IPPO, or a parallel env"
        )
    vec_env = as_multiagent_vec_env(CriticInputWrapper(to_parallel_env(env), critic_input) if env is not None else None)
    vec_env.critic_input = critic_input
    return vec_env


class MAPPO(IPPO):
    """
    Multi-Agent PPO: IPPO (see :class:`sb3_ippo.IPPO`, whose parameters it takes, all of them, with the same defaults)
    with a centralized critic.

    Every agent (or group sharing parameters) keeps its own actor, which sees only the agent's own observation; its
    critic sees a centralized input instead: the env's global state, or every agent's observation
    (:mod:`sb3_ippo.common.critic_input`). The env copies compute that input at every step, so it is stored with each
    agent's transitions, its values are recomputed at update time (fresh-value GAE), a truncated trajectory bootstraps
    from V(critic input at its last step), and ``normalize_obs`` normalizes it too. Groups, ``batched``, the learner
    process, version stamps, save/load (zip and safetensors) and callbacks work as for IPPO.

    Acting needs only each agent's own observation: ``predict``, ``evaluate_policy`` and ``MultiAgentEvalCallback``
    take the env's plain observations. ``model.observation_spaces[agent]`` is the space of what the agent's policy
    is trained on, ``Dict(obs=own observation space, critic=Box(critic input))``.

    :param policy: "MlpPolicy" (:class:`sb3_ippo.mappo.policies.CentralCriticPolicy`) or a subclass of it.
    :param env: A PettingZoo ``ParallelEnv`` with Box observations, or ``make_vec_env(env_fn, n_envs,
        critic_input=...)`` made with this model's critic input.
    :param critic_input: What the critic sees: ``"state"`` (the env's ``state()``; an env without one is a
        ``ValueError`` that names ``"joint_obs"``) or ``"joint_obs"`` (every agent's observation in
        ``possible_agents`` order, with a zero-filled slot and an alive flag of 0 for an absent agent).
    :param critic_own_obs: Add the agent's own observation to the critic input (with ``"state"``: MAPPO's
        agent-specific global state).
    :param critic_agent_id: Add a one-hot of the agent's index in ``possible_agents`` to the critic input (useful
        with ``share_parameters``, where one critic predicts every member's value).
    :param kwargs: IPPO's parameters (``n_episodes``, ``n_epochs``, ``groups``, ``batched``, ``async_training``, ...).
    """

    policy_aliases: ClassVar[dict[str, type[BasePolicy]]] = {"MlpPolicy": CentralCriticPolicy}

    def __init__(
        self,
        policy: str | type[ActorCriticPolicy],
        env: Any,
        critic_input: CriticInputKind = "state",
        critic_own_obs: bool = False,
        critic_agent_id: bool = False,
        **kwargs: Any,
    ) -> None:
        if isinstance(policy, type) and issubclass(policy, ActorCriticPolicy) and not issubclass(policy, CentralCriticPolicy):
            raise TypeError(
                f"MAPPO's policy must be 'MlpPolicy' or a CentralCriticPolicy subclass (its actor reads the own "
                f"observation, its critic the critic input), got {policy.__name__}"
            )
        spec = CriticInput(critic_input, bool(critic_own_obs), bool(critic_agent_id))
        self.critic_input = critic_input
        self.critic_own_obs = spec.own_obs
        self.critic_agent_id = spec.agent_id
        if kwargs.get("opponents") is not None or kwargs.get("self_play_pool") is not None:
            raise ValueError("MAPPO does not take opponents or self_play_pool (turn-based games): use IPPO for games")
        vec_env = None if env is None else critic_input_vec_env(env, spec)
        super().__init__(policy, vec_env, **kwargs)

    @property
    def critic_input_spec(self) -> CriticInput:
        """The critic input, as :class:`sb3_ippo.common.critic_input.CriticInput`."""
        return CriticInput(self.critic_input, self.critic_own_obs, self.critic_agent_id)

    def set_env(self, env: Any, force_reset: bool = True) -> None:
        """Use a new env (same agents and spaces): a PettingZoo env, which gets this model's critic input, or a
        vectorized env made with it (see ``env``)."""
        if env is not None and not isinstance(env, MultiAgentVecEnv) and not needs_turns(env):
            parallel_env = to_parallel_env(env)
            self._check_own_spaces({agent: parallel_env.observation_space(agent) for agent in parallel_env.possible_agents})
        super().set_env(critic_input_vec_env(env, self.critic_input_spec), force_reset)

    def check_acting_env(self, env: MultiAgentVecEnv) -> None:
        """Check that the model can act on ``env``'s plain observations (as ``evaluate_policy`` steps it): the same
        agents, own observation spaces and action spaces.

        :raises ValueError: naming the first agent that differs.
        """
        own_spaces = {agent: space[OBS_KEY] for agent, space in self.observation_spaces.items()}  # type: ignore[index]
        check_env_matches(self.possible_agents, own_spaces, self.action_spaces, env)

    def _check_own_spaces(self, env_spaces: Mapping[AgentID, spaces.Space]) -> None:
        """:raises ValueError: naming the first agent whose own observation space in ``env_spaces`` differs from the
        model's (before the critic inputs, which every agent's observations enter, differ for all of them)."""
        for agent in self.possible_agents:
            model_space = self.observation_spaces[agent][OBS_KEY]  # type: ignore[index]
            if agent in env_spaces and env_spaces[agent] != model_space:
                raise ValueError(
                    f"Agent {agent!r}: the env's observation space {env_spaces[agent]} differs from the model's {model_space}"
                )

    @classmethod
    def load(  # type: ignore[override]
        cls: type[SelfMAPPO],
        path: str | pathlib.Path | io.BufferedIOBase,
        env: Any = None,
        device: th.device | str = "auto",
        custom_objects: dict[str, Any] | None = None,
        print_system_info: bool = False,
        force_reset: bool = True,
        trusted: bool = True,
        **kwargs: Any,
    ) -> SelfMAPPO:
        """IPPO's ``load`` (see there); ``env`` is a PettingZoo env (given the saved critic input) or a vectorized env
        made with that critic input."""
        model = super().load(path, None, device, custom_objects, print_system_info, force_reset, trusted, **kwargs)
        if env is not None:
            # The file says what the critic sees: only now can the env's copies be made to compute it.
            model.set_env(env, force_reset)
            if model.seed is not None and model.env is not None:
                model.env.seed(model.seed)
        return model

    def predict(  # type: ignore[override]
        self,
        observation: Mapping[AgentID, Any],
        state: Mapping[AgentID, PredictState] | None = None,
        episode_start: np.ndarray | Mapping[AgentID, np.ndarray] | None = None,
        deterministic: bool = False,
    ) -> tuple[dict[AgentID, np.ndarray], dict[AgentID, PredictState] | None]:
        """IPPO's ``predict`` on the agents' own observations, as the env gives them (the actors see nothing else).
        Observations that already carry the critic input (``{"obs": ..., "critic": ...}``) are taken too."""
        if not isinstance(observation, Mapping):
            return super().predict(observation, state, episode_start, deterministic)
        with_input = {}
        for agent, obs in observation.items():
            space = self.observation_spaces.get(agent)
            if space is None or (isinstance(obs, Mapping) and set(obs) == {OBS_KEY, CRITIC_KEY}):
                with_input[agent] = obs
                continue
            assert isinstance(space, spaces.Dict) and has_critic_input(space)
            own = np.asarray(obs)
            own_shape, critic_shape = space[OBS_KEY].shape or (), space[CRITIC_KEY].shape or ()
            if own.ndim not in (len(own_shape), len(own_shape) + 1) or own.shape[own.ndim - len(own_shape) :] != own_shape:
                raise ValueError(
                    f"Agent {agent!r}: its observation (shape {own.shape}) does not fit its observation space "
                    f"{space[OBS_KEY]}; expected shape {own_shape} or (n, *{own_shape})"
                )
            rows = own.shape[: own.ndim - len(own_shape)]
            with_input[agent] = {OBS_KEY: own, CRITIC_KEY: np.zeros((*rows, *critic_shape), np.float32)}
        return super().predict(with_input, state, episode_start, deterministic)

    def export_agent(self, agent_id: AgentID, path: str | pathlib.Path | io.BufferedIOBase) -> None:
        """Write one agent's actor as a plain SB3 ``PPO`` zip on the agent's own observation space:
        ``stable_baselines3.PPO.load(path)`` opens it, and its deterministic actions on the env's observations equal
        this model's (``normalize_obs`` statistics folded in, as IPPO's ``export_agent`` does; an image observation
        space is stored channel-first, as the actor takes it, and ``predict`` transposes the env's images).

        The centralized critic is not exported: it needs the critic input, which a deployed agent does not have. The
        exported value network has the actor's layout with a zero output layer (V = 0 everywhere), and the optimizer
        state is fresh; a PPO that continues training from the file learns a decentralized critic from there.

        :raises KeyError: for an unknown agent id.
        """
        export_actor(self, agent_id, path)
