"""The Python snippets of README.md, docs/usage.md and docs/getting-started.md run as written (with a smaller budget,
in a temporary folder, without the progress bar's tqdm and rich, which the library alone does not install); the API
reference covers every public name; the site's link hooks keep folder links and links out of docs/ working, and
broken ones failing."""

from __future__ import annotations

import pathlib
import re
import subprocess
import sys

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
def test_readme_snippet_runs_verbatim_and_prints_a_few_hundred_lines_at_most(
    tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    run_snippet(python_blocks(ROOT / "README.md")[0], {}, tmp_path, monkeypatch)

    lines = capsys.readouterr().out.splitlines()
    assert len(lines) <= 400, f"{len(lines)} lines"
    assert lines[-1].startswith("IPPO learned 200,000 env steps")


def test_every_hyperparameter_file_the_readme_uses_is_one_it_writes(tmp_path: pathlib.Path) -> None:
    from sb3_ippo.cli.settings import DEFAULT_ENV
    from sb3_ippo.hyperparams.files import hyperparameter_types, read_hyperparams_file

    readme = (ROOT / "README.md").read_text()
    used = re.findall(r"--hyperparams (\S+)", readme)
    assert used
    for name in used:
        written = re.search(rf"cat > {re.escape(name)} <<'EOF'\n(.*?\n)EOF\n", readme, flags=re.S)
        assert written is not None, f"README.md runs --hyperparams {name} without writing {name}"
        (tmp_path / name).write_text(written.group(1))
        settings = read_hyperparams_file(tmp_path / name, DEFAULT_ENV, hyperparameter_types())
        assert settings["learning_rate"] == "lin_1e-3" and settings["n_envs"] == 8


def test_the_api_reference_documents_every_public_name() -> None:
    import importlib

    import sb3_ippo

    documented = {}
    for path in re.findall(r"^::: ([\w.]+)$", (ROOT / "docs" / "api.md").read_text(), flags=re.M):
        module, name = path.rsplit(".", 1)
        if name in sb3_ippo.__all__:  # the others (sb3_ippo.tracking) need an optional package
            documented[name] = getattr(importlib.import_module(module), name)
    assert set(sb3_ippo.__all__) <= set(documented)
    for name in sb3_ippo.__all__:
        assert documented[name] is getattr(sb3_ippo, name), f"api.md documents {name} from a module that does not define it"


def test_getting_started_snippet_runs(tmp_path: pathlib.Path, monkeypatch: pytest.MonkeyPatch) -> None:
    code = python_blocks(ROOT / "docs" / "getting-started.md")[0]
    budgets = {"total_timesteps=200_000": "total_timesteps=200", "n_eval_episodes=10": "n_eval_episodes=2"}
    namespace = run_snippet(code, budgets, tmp_path, monkeypatch)
    assert isinstance(namespace["mean"], float) and namespace["eval_env"].agents == []


def build_site(tmp_path: pathlib.Path, pages: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``mkdocs build --strict`` of a small site that uses the repository's link hooks, in ``tmp_path/repo``."""
    repo = tmp_path / "repo"
    for name, text in {**pages, "benchmarks/common.py": "# a script\n", "docs/figures/a.txt": "1\n"}.items():
        (repo / name).parent.mkdir(parents=True, exist_ok=True)
        (repo / name).write_text(text)
    nav = [name.removeprefix("docs/") for name in pages if name.startswith("docs/")]
    (repo / "mkdocs.yml").write_text(
        f"site_name: t\nuse_directory_urls: false\nhooks: [{ROOT / 'mkdocs_hooks.py'}]\nnav: {nav}\n"
        "validation: {omitted_files: warn, absolute_links: warn, unrecognized_links: warn, anchors: warn}\n"
    )
    return subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict"], cwd=repo, capture_output=True, text=True, check=False
    )


def test_site_links_to_folders_and_to_files_outside_docs_work_and_broken_ones_fail(tmp_path: pathlib.Path) -> None:
    pytest.importorskip("mkdocs")
    good = "[raw](figures/) [scripts](../benchmarks/) [common](../benchmarks/common.py)\n"
    result = build_site(tmp_path / "good", {"docs/index.md": good})
    assert result.returncode == 0, result.stderr
    site = tmp_path / "good" / "repo" / "site"
    html = (site / "index.html").read_text()
    assert 'href="figures/index.html"' in html and 'href="repository/benchmarks/common.py"' in html
    assert (site / "repository" / "benchmarks" / "common.py").is_file() and (site / "figures" / "a.txt").is_file()
    for broken in ("[gone](../benchmarks/gone.py)\n", "[gone](missing.md)\n", "[gone](nothere/)\n"):
        result = build_site(tmp_path / str(len(broken)), {"docs/index.md": broken})
        assert result.returncode != 0 and "WARNING" in result.stderr, broken


def test_the_changelog_and_the_install_lines_name_the_package_version() -> None:
    import sb3_ippo

    version = sb3_ippo.__version__
    releases = re.findall(r"^## (\d+\.\d+\.\d+)", (ROOT / "CHANGELOG.md").read_text(), flags=re.M)
    assert releases and releases[0] == version, "CHANGELOG.md's latest release is not sb3_ippo.__version__"
    for path in (ROOT / "README.md", ROOT / "docs" / "getting-started.md"):
        assert set(re.findall(r"sb3_ippo-([\d.]+)-py3-none-any\.whl", path.read_text())) == {version}, path


@pytest.mark.parametrize("algorithm", ["sb3_ippo.ippo.ippo.IPPO", "sb3_ippo.mappo.mappo.MAPPO"])
def test_the_api_reference_shows_the_methods_an_sb3_user_calls_on_a_model(algorithm: str) -> None:
    # They are defined on the shared base class, which mkdocstrings leaves out unless told.
    section = (ROOT / "docs" / "api.md").read_text().split(f"::: {algorithm}\n", 1)[1].split(":::", 1)[0]
    inherited = re.search(r"inherited_members: \[(.*)\]", section)
    assert inherited is not None
    assert {"learn", "predict", "save", "load", "export_agent"} <= {name.strip() for name in inherited.group(1).split(",")}
