"""Watching agents: ``render()`` of the multi-agent VecEnv tiles the copies' frames, as SB3's VecEnv does, so that
SB3's ``VecVideoRecorder`` records a multi-agent run."""

from __future__ import annotations

import pathlib
from contextlib import closing

import numpy as np
import pytest
from mpe2 import simple_spread_v3
from stable_baselines3.common.vec_env.base_vec_env import tile_images

from sb3_ippo import IPPO, evaluate_policy, make_vec_env
from tests.envs import DyingAgentsEnv

RGB = {"N": 2, "max_cycles": 5, "render_mode": "rgb_array"}


@pytest.mark.parametrize("vec_env_cls", ["dummy", "subproc"])
def test_render_tiles_the_frames_of_the_copies(vec_env_cls: str) -> None:
    vec_env = make_vec_env(simple_spread_v3.parallel_env, n_envs=3, seed=0, vec_env_cls=vec_env_cls, env_kwargs=RGB)
    with closing(vec_env) as env:
        env.reset()
        frames = env.get_images()
        assert len(frames) == 3 and all(frame.shape == (700, 700, 3) for frame in frames)
        image = env.render()
        assert image.shape == (1400, 1400, 3)  # 3 copies on a 2 x 2 grid, the fourth cell black
        np.testing.assert_array_equal(image, tile_images(frames))
        assert env.metadata["render_fps"] == simple_spread_v3.parallel_env().metadata["render_fps"]


def test_images_need_the_rgb_array_render_mode() -> None:
    with closing(make_vec_env(DyingAgentsEnv, n_envs=2)) as env:
        env.reset()
        with pytest.raises(ValueError, match="render_mode='rgb_array'"):
            env.get_images()
        with pytest.warns(UserWarning, match="no `render_mode`"):
            assert env.render() is None  # SB3's VecEnv behaviour without a render mode


def test_sb3_vec_video_recorder_records_a_multi_agent_run(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("moviepy")
    from stable_baselines3.common.vec_env import VecVideoRecorder

    env = make_vec_env(simple_spread_v3.parallel_env, n_envs=2, seed=0, env_kwargs=RGB)
    model = IPPO("MlpPolicy", env, n_episodes=2, n_epochs=1, policy_kwargs=dict(net_arch=[8]), seed=0)
    recorder = VecVideoRecorder(env, str(tmp_path), record_video_trigger=lambda step: step == 0, video_length=8)
    obs = recorder.reset()
    for _ in range(10):
        actions, _ = model.predict(obs, deterministic=True)
        obs, _, _, _ = recorder.step(actions)
    recorder.close()
    videos = list(tmp_path.glob("*.mp4"))
    assert len(videos) == 1 and videos[0].stat().st_size > 0


def test_evaluate_policy_runs_inside_sb3_vec_env_wrappers(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("moviepy")
    from stable_baselines3.common.vec_env import VecVideoRecorder

    env = make_vec_env(simple_spread_v3.parallel_env, n_envs=1, seed=0, env_kwargs=RGB)
    model = IPPO("MlpPolicy", env, n_episodes=1, n_epochs=1, policy_kwargs=dict(net_arch=[8]), seed=0)
    recorder = VecVideoRecorder(env, str(tmp_path), record_video_trigger=lambda step: step == 0, video_length=100)
    returns, lengths = evaluate_policy(model, recorder, n_eval_episodes=2, return_episode_rewards=True)
    recorder.close()
    assert lengths == [5, 5] and len(returns) == 2
    assert list(tmp_path.glob("*.mp4"))  # 11 frames: the reset and 2 x 5 steps
