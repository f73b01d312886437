"""The Python snippets of README.md and docs/usage.md run as written (with a smaller budget, in a temporary folder,
without the progress bar's tqdm and rich, which the library alone does not install)."""

from __future__ import annotations

import pathlib
import re

import pytest
import stable_baselines3.common.callbacks

ROOT = pathlib.Path(__file__).resolve().parent.parent


def python_blocks(path: pathlib.Path) -> list[str]:
    return re.findall(r"```python\n(.*?)```", path.read_text(), flags=re.S)


def run_snippet(code: str, budgets: dict[str, str], tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> dict:
    # As on an install of the library alone (pip install -e .), where SB3's progress bar raises an ImportError.
    monkeypatch.setattr(stable_baselines3.common.callbacks, "tqdm", None)
    for written, smaller in budgets.items():
        assert written in code, f"the snippet no longer says {written}"
        code = code.replace(written, smaller)
    monkeypatch.chdir(tmp_path)  # the snippets save models into the working folder
    namespace: dict = {"__name__": "__main__"}
    exec(compile(code, "snippet", "exec"), namespace)
    return namespace


def test_readme_snippet_runs(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code = python_blocks(ROOT / "README.md")[0]
    namespace = run_snippet(code, {"total_timesteps=200_000": "total_timesteps=200"}, tmp_path, monkeypatch)
    assert (tmp_path / "ippo_spread.zip").is_file()
    assert namespace["eval_env"].agents == [] and set(namespace["actions"]) == {"agent_0", "agent_1", "agent_2"}


def test_usage_quick_start_runs(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code = python_blocks(ROOT / "docs" / "usage.md")[0]
    budgets = {"total_timesteps=200_000": "total_timesteps=200", "n_eval_episodes=50": "n_eval_episodes=2"}
    namespace = run_snippet(code, budgets, tmp_path, monkeypatch)
    assert isinstance(namespace["mean"], float)


@pytest.mark.slow
def test_readme_snippet_runs_verbatim(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_snippet(python_blocks(ROOT / "README.md")[0], {}, tmp_path, monkeypatch)
