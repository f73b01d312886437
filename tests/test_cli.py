"""The command line: ``python -m sb3_ippo train`` and ``python -m sb3_ippo evaluate``.

Every run here is tiny (simple_spread with 2 agents and 10-step episodes, 16-unit networks, 2 passes) and writes
only into pytest's tmp_path.
"""

from __future__ import annotations

import csv
import importlib.abc
import json
import pathlib
import subprocess
import sys
import zipfile
from typing import Any

import pytest
import torch as th
from mpe2 import simple_spread_v3

import sb3_ippo
import sb3_ippo.cli.evaluate
from sb3_ippo import IPPO, MAPPO
from sb3_ippo.cli import literal, main, to_text, wrapper_spec
from sb3_ippo.cli.settings import claim_run_folder, numbered_run_folder
from tests.helpers import assert_same_parameters, parameters

SMALL_ENV = ["--env-kwargs", "N=2", "max_cycles=10"]
TINY = ["--n-epochs", "2", "--n-episodes", "2", "--policy-kwargs", "dict(net_arch=[16])", "--no-progress-bar"]
QUICK = [*SMALL_ENV, *TINY, "--timesteps", "100", "--n-envs", "2", "--eval-episodes", "0"]


def train(out: pathlib.Path, *options: str) -> pathlib.Path:
    main(["train", "--out", str(out), *QUICK, *options])
    return out


def usage_error(capsys: pytest.CaptureFixture[str], argv: list[str]) -> str:
    """Run the command line, expect a usage error (exit status 2: the error first, then a one-line usage hint) and
    return what it printed."""
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    lines = err.splitlines()  # the error's own lines (a YAML error shows where it is), then the hint
    assert lines[0].startswith("python -m sb3_ippo") and ": error: " in lines[0], err
    assert lines[-1].startswith("usage: python -m sb3_ippo") and lines[-1].endswith("--help lists them)"), err
    assert not any(line.startswith("usage:") for line in lines[:-1]), "the whole usage block"
    return err


# --- train ---------------------------------------------------------------------------------------------------------


def test_train_writes_model_log_curve_and_run_file(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "run"
    main(["train", "--timesteps", "200", "--n-envs", "2", "--eval-episodes", "2", "--out", str(out), *TINY])
    assert {path.name for path in out.iterdir()} == {"model.zip", "progress.csv", "learning_curve.png", "run.json"}
    run = json.loads((out / "run.json").read_text())
    assert run["env"] == "mpe2.simple_spread_v3" and run["env_kwargs"] == {"N": 3, "max_cycles": 25}
    assert run["hyperparameters"]["n_epochs"] == 2 and run["hyperparameters"]["policy_kwargs"] == {"net_arch": [16]}
    model = IPPO.load(out / "model.zip")
    assert model.n_epochs == 2 and model.num_timesteps >= 200
    printed = capsys.readouterr().out
    assert "Final evaluation: 2 episodes, deterministic actions" in printed
    assert all(f"\n  {agent} " in printed for agent in ("team return", "agent_0", "agent_1", "agent_2"))


def test_a_long_evaluation_shows_its_progress(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = train(tmp_path / "run", "--eval-episodes", "3")
    assert "episodes evaluated" not in capsys.readouterr().out  # short episodes: the result only
    monkeypatch.setattr(sb3_ippo.cli.evaluate, "PROGRESS_EVERY", 0.0)  # every episode now takes "long"
    train(tmp_path / "again", "--eval-episodes", "3")
    printed = capsys.readouterr().out
    assert "  1/3 episodes evaluated (" in printed and "  2/3 episodes evaluated (" in printed
    assert printed.index("  2/3 episodes evaluated") < printed.index("Final evaluation: 3 episodes")
    main(["evaluate", str(out), "--episodes", "2"])
    assert "  1/2 episodes evaluated (" in capsys.readouterr().out


def test_train_and_evaluate_a_recurrent_policy(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "run"
    main(["train", "--out", str(out), *QUICK[:-2], "--eval-episodes", "1", "--policy", "MlpLstmPolicy", "--policy-kwargs",
          "dict(net_arch=[16], lstm_hidden_size=8)"])
    model = IPPO.load(out / "model.zip")
    assert all(type(policy).__name__ == "RecurrentActorCriticPolicy" for policy in model.policies.values())
    assert main(["evaluate", str(out / "model.zip"), "--episodes", "1"]) == 0


def test_run_file_holds_every_setting(tmp_path: pathlib.Path) -> None:
    run = json.loads((train(tmp_path / "run", "--seed", "3") / "run.json").read_text())
    for key, value in {"seed": 3, "n_envs": 2, "policy": "MlpPolicy", "vec_env": "dummy", "timesteps": 100}.items():
        assert run[key] == value, key
    # Every hyperparameter, the defaults too, so that a later change of a default does not change the re-run.
    assert run["hyperparameters"]["gamma"] == 0.99 and run["hyperparameters"]["n_steps"] is None
    assert run["command"].startswith("python -m sb3_ippo train --env mpe2.simple_spread_v3")


def test_the_command_in_run_json_reproduces_the_training(tmp_path: pathlib.Path) -> None:
    first = train(tmp_path / "first", "--learning-rate", "lin_1e-3")
    run = json.loads((first / "run.json").read_text())
    main([*run["argv"], "--out", str(tmp_path / "second"), "--no-progress-bar"])
    again = json.loads((tmp_path / "second" / "run.json").read_text())
    assert again["argv"] == run["argv"]
    second = IPPO.load(tmp_path / "second" / "model.zip")
    assert_same_parameters(parameters(IPPO.load(first / "model.zip")), parameters(second))


def test_train_without_matplotlib_says_how_to_get_plots_and_completes(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` now raises ImportError
    monkeypatch.setitem(sys.modules, "matplotlib.pyplot", None)
    out = train(tmp_path / "run", "--eval-episodes", "1")
    printed = capsys.readouterr().out
    assert "matplotlib is not installed (pip install matplotlib" in printed
    assert "Final evaluation" in printed  # the run went on after the plot
    assert (out / "model.zip").is_file() and not (out / "learning_curve.png").exists()


class HiddenPackage(importlib.abc.MetaPathFinder):
    """Imports of ``package`` (and its submodules) fail as they do when it is not installed."""

    def __init__(self, package: str) -> None:
        self.package = package

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> None:
        if fullname == self.package or fullname.startswith(self.package + "."):
            raise ModuleNotFoundError(f"No module named {fullname!r}", name=fullname)


def hide(monkeypatch: pytest.MonkeyPatch, package: str) -> None:
    for name in [name for name in sys.modules if name == package or name.startswith(package + ".")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setattr(sys, "meta_path", [HiddenPackage(package), *sys.meta_path])


@pytest.mark.parametrize(
    ("package", "options", "message"),
    [
        ("mpe2", [], "Cannot import the env module 'mpe2.simple_spread_v3' (No module named 'mpe2'): pip install mpe2"),
        ("supersuit", ["--wrappers", "flatten"], "Wrappers come from SuperSuit, which is not installed: pip install"),
        ("tensorboard", ["--tensorboard-log", "tb"], "TensorBoard is not installed: pip install tensorboard"),
    ],
)
def test_a_missing_optional_package_is_a_usage_error_saying_what_to_install(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch, package: str,
    options: list[str], message: str,
) -> None:
    hide(monkeypatch, package)
    err = usage_error(capsys, ["train", "--out", str(tmp_path / "run"), *options])
    assert message in " ".join(err.split())


def test_video_without_moviepy_is_a_usage_error(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    out = train(tmp_path / "run")
    hide(monkeypatch, "moviepy")
    err = usage_error(capsys, ["evaluate", str(out), "--video", str(tmp_path / "out.mp4")])
    assert "recording needs moviepy: pip install moviepy" in err


def test_no_progress_bar_without_tqdm_and_rich(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    hide(monkeypatch, "rich")
    main(["train", "--out", str(tmp_path / "run"), *SMALL_ENV, "--timesteps", "40", "--n-envs", "1", "--n-episodes", "2",
          "--n-epochs", "1", "--eval-episodes", "0"])  # a progress bar asked for, but SB3's needs rich
    assert (tmp_path / "run" / "model.zip").is_file()


def test_a_budget_too_small_for_an_update_says_so_and_completes(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.warns(UserWarning, match="without a single update"):
        out = train(tmp_path / "run", "--timesteps", "4", "--eval-episodes", "1")
    printed = capsys.readouterr().out
    assert "IPPO.learn ended after 4 env steps without a single update" in printed  # through the SB3 logger too
    assert "No learning curve:" in printed and "Final evaluation" in printed
    assert (out / "model.zip").is_file()


def test_a_second_run_without_out_gets_the_next_numbered_folder(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    first = tmp_path / "runs" / "ippo_simple_spread_v3"
    first.mkdir(parents=True)
    (first / "model.zip").write_text("the first run's model")
    main(["train", *QUICK])
    assert (first / "model.zip").read_text() == "the first run's model"
    assert (tmp_path / "runs" / "ippo_simple_spread_v3_2" / "model.zip").is_file()


def test_runs_started_at_once_claim_different_numbered_folders(tmp_path: pathlib.Path) -> None:
    base = tmp_path / "runs" / "ippo_simple_spread_v3"
    chosen = [numbered_run_folder(base), numbered_run_folder(base)]  # both runs choose before either creates it
    assert chosen == [base, base]
    claimed = [claim_run_folder(base), claim_run_folder(base)]
    assert claimed == [base, base.with_name("ippo_simple_spread_v3_2")] and all(f.is_dir() for f in claimed)


def test_an_out_that_holds_a_model_is_refused_unless_overwrite(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "run"
    out.mkdir()
    (out / "model.zip").write_text("an earlier run's model")
    err = usage_error(capsys, ["train", "--out", str(out), *QUICK])
    assert f"argument --out: {out} already holds model.zip from an earlier run" in err and "--overwrite" in err
    assert (out / "model.zip").read_text() == "an earlier run's model"
    earlier = [out / "checkpoints" / "model_900_steps.zip", out / "eval" / "evaluations.npz", out / "best_model.zip"]
    for path in [*earlier, out / "notes.txt"]:
        path.parent.mkdir(exist_ok=True)
        path.write_text("an earlier run's file")
    train(out, "--overwrite")
    assert IPPO.load(out / "model.zip").num_timesteps >= 100
    assert not any(path.exists() for path in earlier), "the earlier run's checkpoints would pass for this run's"
    assert (out / "notes.txt").read_text() == "an earlier run's file"


def test_out_that_is_a_file_is_a_usage_error(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "taken").write_text("")
    assert "is a file, not a folder" in usage_error(capsys, ["train", "--out", str(tmp_path / "taken")])


def test_learning_curve_has_a_panel_per_agent(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("matplotlib")
    from sb3_ippo.common.plotting import read_curves

    out = train(tmp_path / "run")
    assert list(read_curves(out / "progress.csv")) == ["team", "agent_0", "agent_1"]
    assert (out / "learning_curve.png").stat().st_size > 0


def test_default_output_is_one_summary_line_and_the_full_table_is_at_verbose_2(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    train(tmp_path / "quiet", "--print-every", "0")
    quiet = capsys.readouterr().out
    with (tmp_path / "quiet" / "progress.csv").open() as file:
        rows = list(csv.DictReader(file))
    # Every key of every update still goes to the CSV.
    assert "train/agent_0/policy_loss" in rows[0] and "rollout/agent_0/ep_rew_mean" in rows[0]
    summaries = [line for line in quiet.splitlines() if " env steps | " in line]
    assert len(summaries) == len(rows) and "| rollout/" not in quiet and "agent_0" not in quiet.split("Saved")[0]
    last = rows[-1]
    assert summaries[-1].startswith(f"{int(last['time/total_timesteps'])}/100 env steps | team return ")
    assert f"team return {float(last['rollout/ep_rew_mean']):.2f}" in summaries[-1]
    assert f"policy_version {last['train/policy_version']}" in summaries[-1]
    train(tmp_path / "loud", "--verbose", "2")
    loud = capsys.readouterr().out
    assert "| rollout/" in loud and "agent_0/policy_loss" in loud and " env steps | " not in loud


def test_stdout_prints_at_a_steady_interval_of_env_steps(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    # Dumps at 20, 40, 60, 80 and 100 env steps: the first, then the first at or after each multiple of 60.
    train(tmp_path / "rarely", "--print-every", "60")
    lines = [line.split("/")[0].strip() for line in capsys.readouterr().out.splitlines() if " env steps | " in line]
    assert lines == ["20", "60"]
    train(tmp_path / "table", "--print-every", "60", "--verbose", "2")
    assert capsys.readouterr().out.count("| rollout/") == 2
    train(tmp_path / "silent", "--verbose", "0")
    printed = capsys.readouterr().out
    assert "| rollout/" not in printed and " env steps | " not in printed


def test_a_game_plots_the_win_rate_and_prints_no_team_return(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    pytest.importorskip("matplotlib")
    from sb3_ippo.common.plotting import read_curves

    out = tmp_path / "ttt"
    main(
        [
            "train", "--env", "pettingzoo.classic.tictactoe_v3", "--timesteps", "200", "--n-envs", "2", "--out", str(out),
            "--eval-episodes", "4", "--no-progress-bar", "--n-epochs", "1", "--policy-kwargs", "dict(net_arch=[8])",
            "--n-eval-episodes", "2", "--print-every", "0", "--n-steps", "20",
        ]
    )  # fmt: skip
    printed = capsys.readouterr().out
    # Without --eval-freq, a game is evaluated against a random player 10 times: the curve of its win rate.
    curves = read_curves(out / "progress.csv", game=True)
    assert list(curves) == ["team", "player_1", "player_2"] and len(curves["team"][0]) == 10
    assert all(0.0 <= rate <= 1.0 for _, rates in curves.values() for rate in rates)
    assert (out / "learning_curve.png").stat().st_size > 0
    assert json.loads((out / "run.json").read_text())["logging"]["eval_freq"] == 20
    assert "team return" not in printed and "win rate vs random " in printed
    assert "Final evaluation: 4 games per seat against a uniformly random player, deterministic actions" in printed
    assert "\n  win rate  " in printed and "\n  player_1  win " in printed


def test_a_game_with_eval_freq_0_has_no_curve_and_says_why(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("matplotlib")
    out = tmp_path / "ttt"
    main(
        [
            "train", "--env", "pettingzoo.classic.tictactoe_v3", "--timesteps", "100", "--n-envs", "2", "--out", str(out),
            "--eval-episodes", "0", "--no-progress-bar", "--n-epochs", "1", "--policy-kwargs", "dict(net_arch=[8])",
            "--eval-freq", "0", "--n-steps", "20",
        ]
    )  # fmt: skip
    assert "has no win rate (--eval-freq 0?)" in capsys.readouterr().out
    assert not (out / "learning_curve.png").exists()


def test_env_step_tick_labels_are_short() -> None:
    from sb3_ippo.common.plotting import env_steps_label

    assert [env_steps_label(x) for x in (0, 500, 25_000, 200_000, 1_500_000)] == ["0", "500", "25k", "200k", "1.5M"]


def test_tensorboard_checkpoints_and_evaluation_during_training(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("tensorboard")
    out = train(
        tmp_path / "run", "--tensorboard-log", str(tmp_path / "tb"), "--checkpoint-freq", "40", "--eval-freq", "40",
        "--n-eval-episodes", "1",
    )
    assert list((tmp_path / "tb" / "IPPO_1").glob("events.out.tfevents.*"))
    assert len(list((out / "checkpoints").glob("model_*_steps.zip"))) >= 2
    assert (out / "best_model.zip").is_file() and (out / "eval" / "evaluations.npz").is_file()
    with (out / "progress.csv").open() as file:
        assert "eval/mean_reward" in next(csv.reader(file))
    checkpoint = sorted((out / "checkpoints").glob("model_*_steps.zip"))[0]
    assert main(["evaluate", str(checkpoint), "--episodes", "1"]) == 0  # the env: from run.json in the run folder


def test_log_interval_that_would_write_no_curve_is_refused(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    # 100 env steps of 10-step episodes, 2 per update: about 5 updates.
    err = usage_error(capsys, ["train", "--out", str(tmp_path / "run"), *QUICK, "--log-interval", "50"])
    assert "--log-interval: 50 would write no learning curve" in err and "about 5 updates" in err
    assert not (tmp_path / "run").exists()
    train(tmp_path / "run", "--log-interval", "2")  # 2 rows or so: accepted
    assert (tmp_path / "run" / "learning_curve.png").exists()


def test_log_interval_check_counts_updates_on_the_rollout_cadence(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    # An update every 5 steps of each of 2 copies: 10 updates in 100 env steps, whatever the episodes' length.
    rollout = ["--rollout-len", "5", "--n-episodes", "None"]
    err = usage_error(capsys, ["train", "--out", str(tmp_path / "run"), *QUICK, *rollout, "--log-interval", "50"])
    assert "about 10 updates" in err and "rollouts of 5 steps of each of the 2 env copies (rollout_len=5)" in err
    train(tmp_path / "run", *rollout, "--log-interval", "4")
    assert (tmp_path / "run" / "learning_curve.png").exists()


@pytest.mark.parametrize(
    ("align", "rollout", "updates"),
    # 10-step episodes: rollouts of 15 end with the first episode (20 env steps per update), or cut the second (30).
    [("True", 10, 5), ("False", 15, 3)],
)
def test_log_interval_check_counts_rollouts_that_end_with_the_episodes(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], align: str, rollout: int, updates: int
) -> None:
    options = ["--rollout-len", "15", "--n-episodes", "None", "--align-rollouts", align, "--log-interval", "50"]
    err = usage_error(capsys, ["train", "--out", str(tmp_path / "run"), *QUICK, *options])
    assert f"about {updates} updates" in err and f"rollouts of {rollout} steps of each of the 2 env copies" in err


def test_hyperparameter_file_one_section_per_env(tmp_path: pathlib.Path) -> None:
    file = tmp_path / "ippo.yml"
    file.write_text(
        "mpe2.simple_adversary_v3:\n"
        "  n_epochs: 7\n"
        "simple_spread_v3:\n"  # the env's short name works too
        "  n_timesteps: !!float 1e2\n"
        "  n_envs: 1\n"
        "  env_kwargs: {N: 2, max_cycles: 10}\n"
        "  n_epochs: 3\n"
        "  n_episodes: 2\n"
        "  gamma: 0.9\n"
        "  learning_rate: lin_1e-3\n"
        "  policy_kwargs: 'dict(net_arch=[16], activation_fn=nn.ReLU)'\n"
    )
    out = tmp_path / "run"
    main(["train", "--hyperparams", str(file), "--n-epochs", "4", "--out", str(out), "--no-progress-bar",
          "--eval-episodes", "0"])
    model = IPPO.load(out / "model.zip")
    assert model.n_epochs == 4  # the command line wins over the file
    assert model.gamma == 0.9 and model.n_envs == 1 and model.possible_agents == ["agent_0", "agent_1"]
    assert model.lr_schedule(1.0) == pytest.approx(1e-3) and model.lr_schedule(0.5) == pytest.approx(5e-4)
    assert model.policy_kwargs["activation_fn"] is th.nn.ReLU
    run = json.loads((out / "run.json").read_text())
    assert run["timesteps"] == 100 and run["hyperparameters"]["learning_rate"] == "lin_1e-3"
    assert run["hyperparameters"]["policy_kwargs"] == {"net_arch": [16], "activation_fn": "nn.ReLU"}


@pytest.mark.filterwarnings("ignore:IPPO.learn ended after .* without a single update:UserWarning")
def test_the_packaged_tuned_settings_apply_under_the_file_and_the_command_line(tmp_path: pathlib.Path) -> None:
    file = tmp_path / "ippo.yml"
    file.write_text("tictactoe_v3:\n  n_epochs: 1\n  batch_size: 64\n")
    out = tmp_path / "run"
    main(["train", "--env", "pettingzoo.classic.tictactoe_v3", "--hyperparams", str(file), "--batch-size", "32",
          "--policy-kwargs", "dict(net_arch=[8])", "--timesteps", "50", "--n-envs", "1", "--out", str(out),
          "--no-progress-bar", "--eval-episodes", "0"])  # fmt: skip
    run = json.loads((out / "run.json").read_text())
    hyperparameters = run["hyperparameters"]
    assert hyperparameters["n_epochs"] == 1  # the user's file wins over the tuned settings
    assert hyperparameters["batch_size"] == 32 and hyperparameters["policy_kwargs"] == {"net_arch": [8]}  # the command line
    tuned = {"share_parameters": True, "self_play_pool": {"snapshot_every": 10, "size": 20}, "n_steps": 1024,
             "n_episodes": None, "learning_rate": "lin_1e-3", "ent_coef": 0.01}  # fmt: skip
    assert {name: hyperparameters[name] for name in tuned} == tuned
    assert run["argv"][run["argv"].index("--n-steps") + 1] == "1024"  # the command re-runs without the packaged file


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("simple_spread_v3:\n  n_epoch: 3\n", "unknown key 'n_epoch'; valid keys"),
        ("simple_spread_v3:\n  clip_range: -0.1\n", "clip_range must be a positive number"),
        ("simple_spread_v3:\n  n_envs: 0\n", "n_envs: must be a positive integer"),
        ("simple_spread_v3:\n  wrappers: [no_such_wrapper]\n", "Unknown SuperSuit wrapper 'no_such_wrapper'"),
        ("simple_spread_v3:\n  policy: MLPPolicy\n", "policy: must be one of"),
        ("pistonball_v6:\n  n_epochs: 3\n", "has no section for mpe2.simple_spread_v3: its sections are pistonball_v6"),
        ("- just a list\n", "must map env ids to sections"),
        ("simple_spread_v3: [\n", "is not valid YAML"),
    ],
)
def test_hyperparameter_file_mistakes_are_usage_errors(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], content: str, message: str
) -> None:
    file = tmp_path / "ippo.yml"
    file.write_text(content)
    assert message in usage_error(capsys, ["train", "--hyperparams", str(file), "--out", str(tmp_path / "run")])


def test_supersuit_wrapper_chain_on_pistonball(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("pymunk")
    out = tmp_path / "piston"
    main(
        ["train", "--env", "pettingzoo.butterfly.pistonball_v6", "--env-kwargs", "n_pistons=3", "max_cycles=8",
         "continuous=False", "--wrappers", "color_reduction", "resize:x_size=40,y_size=40", "frame_stack",
         "--policy", "CnnPolicy", "--timesteps", "16", "--n-envs", "1", "--n-episodes", "1", "--n-epochs", "1",
         "--policy-kwargs", "dict(net_arch=[8], features_extractor_kwargs=dict(features_dim=8))",
         "--eval-episodes", "1", "--no-progress-bar", "--verbose", "0", "--out", str(out)]
    )
    model = IPPO.load(out / "model.zip")
    assert model.observation_spaces["piston_0"].shape == (40, 40, 4)  # gray, resized, 4 frames stacked
    assert model.policy_version >= 1
    run = json.loads((out / "run.json").read_text())
    assert run["wrappers"] == ["color_reduction_v0", "resize_v1:x_size=40,y_size=40", "frame_stack_v2"]
    capsys.readouterr()
    main(["evaluate", str(out), "--episodes", "1"])  # the wrappers come back from run.json
    assert "with wrappers color_reduction_v0 resize_v1" in capsys.readouterr().out


def test_wrappers_take_defaults_and_keyword_arguments() -> None:
    pytest.importorskip("supersuit")
    assert wrapper_spec("resize").resolved().kwargs == {"x_size": 84, "y_size": 84}
    assert wrapper_spec("reshape:shape=(84,84,1)").kwargs == {"shape": (84, 84, 1)}
    assert wrapper_spec("dtype:dtype=float32").kwargs == {"dtype": "float32"}
    assert wrapper_spec("frame_stack_v1:stack_size=3").resolved().name == "frame_stack_v1"


def test_module_entry_point_shows_full_help_with_defaults() -> None:
    result = subprocess.run([sys.executable, "-m", "sb3_ippo", "train", "--help"], capture_output=True, text=True, check=True)
    text = " ".join(result.stdout.split())
    assert "--timesteps" in text and "--max-version-lag" in text and "--hyperparams" in text and "--wrappers" in text
    # The whole docstring of every hyperparameter (policy_kwargs' used to be cut at "e.g."), with its default.
    assert "Keyword arguments for every agent's policy, e.g. ``dict(net_arch=[64, 64])``. Where" in text
    assert "except with gSDE. (default: None)" in text
    for default in ("(default: 200000)", "(default: 8)", "(default: dummy)", "(default: MlpPolicy)", "(default: 128)"):
        assert default in text, default


# --- usage errors ---------------------------------------------------------------------------------------------------

BAD_TRAIN_OPTIONS = [
    (["--target-kl", "nothing"], "argument --target-kl: expected a number or None, got 'nothing'"),
    (["--target-kl", "-1"], "target_kl must be a positive number or None"),
    (["--env-kwargs", "N"], "argument --env-kwargs: expected KEY=VALUE"),
    (["--timesteps", "0"], "argument --timesteps: expected a positive integer"),
    (["--timesteps", "lots"], "argument --timesteps: expected a positive integer"),
    (["--n-envs", "-2"], "argument --n-envs: expected a positive integer"),
    (["--clip-range", "-0.1"], "clip_range must be a positive number"),
    (["--clip-range-vf", "0"], "clip_range_vf must be None"),
    (["--learning-rate", "0"], "learning_rate must be a positive number"),
    (["--learning-rate", "lin_x"], "argument --learning-rate: expected a number or lin_<number>"),
    (["--gamma", "1.5"], "gamma must be a number in [0, 1]"),
    (["--gae-lambda", "-0.1"], "gae_lambda must be a number in [0, 1]"),
    (["--ent-coef", "-0.01"], "ent_coef must be a number >= 0"),
    (["--vf-coef", "nan"], "vf_coef must be a number >= 0"),
    (["--max-grad-norm", "0"], "max_grad_norm must be a positive number or None"),
    (["--batch-size", "2.5"], "argument --batch-size: expected an integer or None"),
    (["--n-epochs", "None"], "argument --n-epochs: expected an integer, got 'None'"),
    (["--normalize-obs", "maybe"], "argument --normalize-obs: expected True or False"),
    (["--policy-kwargs", "net_arch"], 'argument --policy-kwargs: expected a dict, e.g. "dict(net_arch=[64, 64])"'),
    (["--policy-kwargs", "dict(activation_fn=nn.Relu)"], "torch.nn has no module 'Relu'"),
    (["--policy", "MLPPolicy"], "argument --policy: invalid choice: 'MLPPolicy'"),
    (["--vec-env", "ray"], "argument --vec-env: invalid choice: 'ray'"),
    (["--device", "gpu0"], "argument --device: expected auto, cpu, cuda"),
    (["--verbose", "3"], "argument --verbose: invalid choice: 3"),
    (["--seed", "-1"], "argument --seed: expected an integer >= 0"),
    (["--log-interval", "0"], "argument --log-interval: expected a positive integer"),
    (["--n-episodes", "None", "--rollout-len", "None"], "n_episodes and n_steps are both None"),
    (["--n-episodes", "None", "--rollout-len", "None", "--log-interval", "3"], "n_episodes and n_steps are both None"),
    (["--max-version-lag", "0", "--async-training", "True"], "max_version_lag >= 1"),
    (["--max-buffered-episodes", "1", "--n-episodes", "4"], "max_buffered_episodes (1) must be at least n_episodes (4)"),
    (["--env", "mpe2.no_such_env"], "Cannot import the env module 'mpe2.no_such_env'"),
    (["--env", "no_such_package.some_env"], "pip install no_such_package"),
    # An older version of a PettingZoo env: PettingZoo's own hint, and the module to give.
    (["--env", "pettingzoo.sisl.pursuit_v4"],
     "argument --env: Cannot import the env module 'pettingzoo.sisl.pursuit_v4': pursuit_v4 is now deprecated, use "
     "pursuit_v5 instead (--env pettingzoo.sisl.pursuit_v5)"),
    (["--env", "pettingzoo.butterfly.knights_archers_zombies_v10"],
     "knights_archers_zombies_v10 is now deprecated, use knights_archers_zombies_v11 instead"),
    (["--env", "pettingzoo.utils"], "has neither parallel_env() nor env()"),
    (["--env-kwargs", "N=many"], "cannot make the env mpe2.simple_spread_v3 with env kwargs {'N': 'many'}"),
    (["--env-kwargs", "colour=1"], "unexpected keyword argument 'colour'"),
    (["--wrappers", "resiz"], "Unknown SuperSuit wrapper 'resiz': choose from"),
    (["--wrappers", "resize:x=3"], "The wrapper resize has no argument x: its arguments are x_size, y_size"),
    (["--wrappers", "resize:64"], "its arguments are KEY=VALUE"),
    (["--wrappers", "reshape"], "The wrapper reshape needs shape: e.g. reshape:shape=VALUE"),
    (["--hyperparams", "no_such_file.yml"], "argument --hyperparams: cannot read no_such_file.yml"),
    (["--eval-episodes", "-1"], "argument --eval-episodes: expected an integer >= 0"),
    (["--no-such-option"], "unrecognized arguments: --no-such-option"),
]


def test_a_usage_error_says_what_was_wrong_first_then_a_one_line_usage_hint(capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["train", "--timesteps", "0"])
    assert exit_info.value.code == 2
    assert capsys.readouterr().err == (
        "python -m sb3_ippo train: error: argument --timesteps: expected a positive integer, got '0' (0 < 1)\n"
        "usage: python -m sb3_ippo train [options] (python -m sb3_ippo train --help lists them)\n"
    )


def test_version_prints_the_package_version(capsys: pytest.CaptureFixture[str]) -> None:
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:
        main(["--version"])
    assert exit_info.value.code == 0
    assert capsys.readouterr().out == f"sb3_ippo {sb3_ippo.__version__}\n"


@pytest.mark.parametrize(("options", "message"), BAD_TRAIN_OPTIONS, ids=[" ".join(o) for o, _ in BAD_TRAIN_OPTIONS])
def test_a_bad_train_option_is_a_usage_error(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], options: list[str], message: str
) -> None:
    err = usage_error(capsys, ["train", "--out", str(tmp_path / "run"), "--timesteps", "10", *options])
    assert message in " ".join(err.split()), err
    assert not (tmp_path / "run").exists()  # refused before anything was written


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["train", "--polcy", "MlpPolicy"], "unrecognized arguments: --polcy MlpPolicy; --polcy: did you mean --policy?"),
        (["train", "--n-epoch=3"], "unrecognized arguments: --n-epoch=3; --n-epoch: did you mean --n-epochs?"),
        (["evaluate", "run", "--episode", "3"], "unrecognized arguments: --episode 3; --episode: did you mean --episodes?"),
    ],
)
def test_a_misspelled_option_is_a_usage_error_of_its_subcommand_naming_the_closest_option(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], argv: list[str], message: str
) -> None:
    monkeypatch.chdir(tmp_path)  # where a run would write, were the option taken
    err = usage_error(capsys, argv)
    assert err.startswith(f"python -m sb3_ippo {argv[0]}: error: ")  # the subcommand's, not the top-level one
    assert message in err, err


def test_a_prefix_of_an_option_is_not_taken_for_the_option(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    err = usage_error(capsys, ["train", "--out", str(tmp_path / "run"), *QUICK, "--timestep", "1000"])
    assert "unrecognized arguments: --timestep 1000; --timestep: did you mean --timesteps?" in err, err


# --- evaluate -------------------------------------------------------------------------------------------------------


def test_evaluate_reads_the_env_from_the_run_file(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "adversary"
    main(["train", "--env", "mpe2.simple_adversary_v3", "--env-kwargs", "max_cycles=10", "--timesteps", "100",
          "--n-envs", "1", "--out", str(out), "--eval-episodes", "0", *TINY])
    capsys.readouterr()
    main(["evaluate", str(out / "model.zip"), "--episodes", "2"])
    printed = capsys.readouterr().out
    assert "mpe2.simple_adversary_v3 {'max_cycles': 10}: 2 episodes, deterministic actions" in printed
    for name in ("team return", "adversary_0", "agent_0", "agent_1"):
        assert f"\n  {name} " in printed, name


def test_evaluate_a_run_folder_uses_its_model(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = train(tmp_path / "run")
    capsys.readouterr()
    result = main(["evaluate", str(out), "--episodes", "2", "--stochastic"])
    assert result == 0
    assert "{'N': 2, 'max_cycles': 10}: 2 episodes, stochastic (sampled) actions" in capsys.readouterr().out


def test_evaluate_a_safetensors_model_beside_its_run_file(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = train(tmp_path / "run")
    IPPO.load(out / "model.zip").save(out / "model.safetensors")
    capsys.readouterr()
    assert main(["evaluate", str(out / "model.safetensors"), "--episodes", "2"]) == 0
    assert "{'N': 2, 'max_cycles': 10}: 2 episodes, deterministic actions" in capsys.readouterr().out


def test_evaluate_a_model_moved_away_from_its_run_file_reads_the_env_from_the_zip(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = train(tmp_path / "run")
    moved = tmp_path / "elsewhere" / "spread.zip"
    moved.parent.mkdir()
    (out / "model.zip").rename(moved)
    assert "run.json" in zipfile.ZipFile(moved).namelist()
    capsys.readouterr()
    main(["evaluate", str(moved), "--episodes", "1"])
    assert "mpe2.simple_spread_v3 {'N': 2, 'max_cycles': 10}" in capsys.readouterr().out


def test_evaluate_a_zip_saved_from_python_asks_for_the_env(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    IPPO("MlpPolicy", simple_spread_v3.parallel_env(N=2), policy_kwargs=dict(net_arch=[8])).save(tmp_path / "m.zip")
    err = usage_error(capsys, ["evaluate", str(tmp_path / "m.zip")])
    assert "argument --env:" in err and "give it with --env MODULE" in " ".join(err.split())
    # With the wrong env: a usage error naming the agent, not a traceback.
    err = usage_error(capsys, ["evaluate", str(tmp_path / "m.zip"), "--env", "mpe2.simple_spread_v3"])
    assert "agent 'agent_2'" in err and "--env-kwargs" in err
    main(["evaluate", str(tmp_path / "m.zip"), "--env", "mpe2.simple_spread_v3", "--env-kwargs", "N=2", "--episodes", "1"])
    assert "team return" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("target", "message"),
    [
        ("nothing.zip", "No model at"),
        ("folder", "has no model.zip"),
        ("notes.txt", "is neither a zip nor a safetensors model file"),
    ],
)
def test_evaluating_something_that_is_not_a_model_is_a_usage_error(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], target: str, message: str
) -> None:
    (tmp_path / "folder").mkdir()
    (tmp_path / "notes.txt").write_text("not a model")
    assert message in usage_error(capsys, ["evaluate", str(tmp_path / target), "--env", "mpe2.simple_spread_v3"])


def test_evaluating_a_truncated_model_says_it_is_damaged(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    model_file = train(tmp_path / "run") / "model.zip"
    content = model_file.read_bytes()
    for kept in (0.5, 0.9):
        model_file.write_bytes(content[: int(len(content) * kept)])
        err = usage_error(capsys, ["evaluate", str(model_file)])
        assert f"argument model: {model_file} is a damaged zip, cut short" in err, err


BAD_EVALUATE_OPTIONS = [
    (["--episodes", "0"], "argument --episodes: expected a positive integer"),
    (["--seed", "x"], "argument --seed: expected an integer >= 0"),
    (["--device", "tpu9"], "argument --device: expected auto, cpu, cuda"),
    (["--env", "mpe2.no_such_env"], "Cannot import the env module 'mpe2.no_such_env'"),
    (["--env-kwargs", "N=two"], "cannot make the env mpe2.simple_spread_v3 with env kwargs {'N': 'two'}"),
    (["--env-kwargs", "N=3"], "does not fit the env mpe2.simple_spread_v3 {'N': 3}: The env's agents differ"),
    (["--env", "mpe2.simple_adversary_v3"], "does not fit the env mpe2.simple_adversary_v3"),
    (["--wrappers", "dtype:dtype=float64"], "observation space"),
    # A 1-D observation cannot be resized: SuperSuit asserts without a message.
    (["--wrappers", "resize"], "and wrappers resize: AssertionError raised in the env or a wrapper"),
]


@pytest.mark.parametrize(("options", "message"), BAD_EVALUATE_OPTIONS, ids=[" ".join(o) for o, _ in BAD_EVALUATE_OPTIONS])
def test_a_bad_evaluate_option_is_a_usage_error(
    tmp_path_factory: pytest.TempPathFactory, capsys: pytest.CaptureFixture[str], options: list[str], message: str
) -> None:
    out = tmp_path_factory.getbasetemp() / "evaluate_options_run"
    if not (out / "model.zip").exists():
        train(out)
    err = usage_error(capsys, ["evaluate", str(out), "--episodes", "1", *options])
    assert message in " ".join(err.split()), err


def test_evaluate_records_a_video(tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("moviepy")
    import imageio.v2 as imageio

    out = train(tmp_path / "run", "--env-kwargs", "N=2", "max_cycles=20")
    video = tmp_path / "videos" / "out.mp4"
    main(["evaluate", str(out), "--episodes", "1", "--video", str(video)])
    assert f"Saved the video of the 1 episodes to {video}" in capsys.readouterr().out
    assert video.stat().st_size > 0 and [path.name for path in video.parent.iterdir()] == ["out.mp4"]
    reader = imageio.get_reader(video)
    assert reader.get_meta_data()["duration"] >= 2.0  # 21 frames (reset + 20 steps) at simple_spread's 10 fps
    reader.close()


def test_a_relative_video_path_goes_into_the_run_folder(
    tmp_path: pathlib.Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    pytest.importorskip("moviepy")
    out = train(tmp_path / "run")
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    main(["evaluate", str(out), "--episodes", "1", "--video", "spread.mp4"])
    assert f"Saved the video of the 1 episodes to {out / 'spread.mp4'}" in capsys.readouterr().out
    assert (out / "spread.mp4").stat().st_size > 0 and list(elsewhere.iterdir()) == []
    checkpoint = out / "checkpoints" / "model_40_steps.zip"  # a checkpoint's run folder is the one above
    checkpoint.parent.mkdir()
    (out / "model.zip").rename(checkpoint)
    main(["evaluate", str(checkpoint), "--episodes", "1", "--video", "videos/again.mp4"])
    assert (out / "videos" / "again.mp4").stat().st_size > 0


# --- value parsing --------------------------------------------------------------------------------------------------


def test_options_parse_python_literals() -> None:
    assert literal("3e-4") == 3e-4 and literal("None") is None and literal("True") is True
    assert literal("dict(net_arch=[64, 64])") == {"net_arch": [64, 64]}
    assert literal("dict(activation_fn=nn.Tanh)") == {"activation_fn": th.nn.Tanh}
    assert literal("cpu") == "cpu"


@pytest.mark.parametrize(
    "value", [3e-4, None, True, {"net_arch": [64, 64]}, {"net_arch": {"pi": [8], "vf": [8]}, "activation_fn": th.nn.ReLU}]
)
def test_option_text_parses_back_to_the_value(value: Any) -> None:
    assert literal(to_text(value)) == value


def test_share_parameters_and_groups_on_the_command_line(tmp_path: pathlib.Path) -> None:
    out = tmp_path / "shared"
    main(["train", "--env", "mpe2.simple_adversary_v3", "--env-kwargs", "max_cycles=10", "--timesteps", "40",
          "--n-envs", "2", "--out", str(out), "--eval-episodes", "0", *TINY,
          "--share-parameters", "{'good': True}", "--groups", "{'good': ['agent_0', 'agent_1']}"])

    model = IPPO.load(out / "model.zip")
    assert dict(model.groups) == {"adversary": ["adversary_0"], "good": ["agent_0", "agent_1"]}
    assert model.policies["agent_0"] is model.policies["agent_1"]
    assert model.policies["adversary_0"] is not model.policies["agent_0"]


@pytest.mark.parametrize(("option", "value"), [("--share-parameters", "maybe"), ("--groups", "['agent_0']")])
def test_bad_group_options_are_usage_errors(capsys: pytest.CaptureFixture[str], option: str, value: str) -> None:
    assert option in usage_error(capsys, ["train", option, value])


def test_train_algo_mappo_writes_a_mappo_model_that_callbacks_and_evaluate_use(tmp_path: pathlib.Path) -> None:
    out = train(
        tmp_path / "run", "--algo", "mappo", "--critic-input", "joint_obs", "--checkpoint-freq", "40", "--eval-freq", "40",
        "--n-eval-episodes", "1",
    )  # fmt: skip
    run = json.loads((out / "run.json").read_text())
    assert (run["algo"], run["critic_input"]) == ("mappo", "joint_obs")
    assert "--algo mappo --critic-input joint_obs" in run["command"]
    model = MAPPO.load(out / "model.zip")
    assert model.critic_input == "joint_obs" and model.num_timesteps >= 100
    assert MAPPO.load(out / "best_model.zip").critic_input == "joint_obs"
    assert list((out / "checkpoints").glob("model_*_steps.zip"))
    assert main(["evaluate", str(out / "model.zip"), "--episodes", "1"]) == 0


def test_critic_input_without_algo_mappo_is_a_usage_error(capsys: pytest.CaptureFixture[str], tmp_path: pathlib.Path) -> None:
    err = usage_error(capsys, ["train", "--critic-input", "state", "--out", str(tmp_path / "run"), *QUICK])
    assert "--critic-input: only --algo mappo" in err
