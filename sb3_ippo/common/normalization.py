"""Persistent per-agent normalization of observations and of value targets, on SB3's ``RunningMeanStd``."""

from __future__ import annotations

import copy

import numpy as np
from gymnasium import spaces
from stable_baselines3.common.preprocessing import is_image_space
from stable_baselines3.common.running_mean_std import RunningMeanStd

from sb3_ippo.games.masking import MASK_KEY
from sb3_ippo.common.type_aliases import ObsArray


def _normalizable(space: spaces.Space) -> bool:
    # Images are scaled by the policy's preprocessing; discrete observations are one-hot encoded.
    return isinstance(space, spaces.Box) and not is_image_space(space, check_channels=False)


class ObservationNormalizer:
    """Running mean and standard deviation of one agent's observations.

    Vector ``Box`` observations, and the vector ``Box`` entries of a ``Dict`` observation, are normalized to
    ``clip((obs - mean) / sqrt(var + epsilon), -clip_obs, clip_obs)``; images and discrete entries pass through.
    The statistics change only through :meth:`update` (called during training), so evaluation and ``predict``
    see frozen statistics.
    """

    def __init__(self, observation_space: spaces.Space, clip_obs: float = 10.0, epsilon: float = 1e-8) -> None:
        self.clip_obs = clip_obs
        self.epsilon = epsilon
        self.obs_rms: RunningMeanStd | dict[str, RunningMeanStd] | None
        if isinstance(observation_space, spaces.Dict):
            self.obs_rms = {
                key: RunningMeanStd(shape=space.shape or ())
                for key, space in observation_space.spaces.items()
                if _normalizable(space) and key != MASK_KEY  # an action mask is not a feature: it passes through
            }
        elif _normalizable(observation_space):
            self.obs_rms = RunningMeanStd(shape=observation_space.shape or ())
        else:
            self.obs_rms = None

    def update(self, obs: ObsArray) -> None:
        """Update the statistics with a batch of observations ``(batch, *obs_shape)``."""
        if isinstance(self.obs_rms, dict):
            assert isinstance(obs, dict)
            for key, rms in self.obs_rms.items():
                rms.update(np.asarray(obs[key], dtype=np.float64))
        elif self.obs_rms is not None:
            self.obs_rms.update(np.asarray(obs, dtype=np.float64))

    def _normalize(self, obs: np.ndarray, rms: RunningMeanStd) -> np.ndarray:
        scaled = (obs - rms.mean) / np.sqrt(rms.var + self.epsilon)
        return np.clip(scaled, -self.clip_obs, self.clip_obs).astype(np.float32)

    def normalize(self, obs: ObsArray) -> ObsArray:
        """Normalize a batch of observations with the current statistics (no update)."""
        if isinstance(self.obs_rms, dict):
            assert isinstance(obs, dict)
            return {
                key: self._normalize(value, self.obs_rms[key]) if key in self.obs_rms else value for key, value in obs.items()
            }
        if self.obs_rms is not None:
            return self._normalize(obs, self.obs_rms)  # type: ignore[arg-type]
        return obs

    def entry(self, key: str) -> ObservationNormalizer:
        """The normalizer of one entry of a Dict observation (frozen statistics shared with this one): its statistics,
        or none for an entry that is not normalized (an image, a discrete entry)."""
        view = copy.copy(self)
        view.obs_rms = self.obs_rms.get(key) if isinstance(self.obs_rms, dict) else None
        return view


class ReturnNormalizer:
    """Running mean and standard deviation of one agent's returns; its value head predicts normalized returns."""

    def __init__(self, epsilon: float = 1e-8) -> None:
        self.return_rms = RunningMeanStd(shape=())
        self.epsilon = epsilon

    @property
    def std(self) -> float:
        # .item(): statistics of shape (1,) too, as .safetensors files written before 0-d arrays were kept 0-d hold.
        return np.sqrt(self.return_rms.var + self.epsilon).item()

    def update(self, returns: np.ndarray) -> None:
        self.return_rms.update(np.asarray(returns, dtype=np.float64).reshape(-1))

    def normalize(self, returns: np.ndarray) -> np.ndarray:
        return ((returns - self.return_rms.mean) / self.std).astype(np.float32)

    def denormalize(self, values: np.ndarray) -> np.ndarray:
        return (values * self.std + self.return_rms.mean).astype(np.float32)
