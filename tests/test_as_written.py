"""What a user's script gets as written: ``learn`` picks torch's thread count for its own processes unless the user
chose one (``sb3_ippo.common.threads``), and ``verbose=1`` prints SB3's table at a cadence a person can read, then one line
on what was learned (``sb3_ippo.common.logs``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import torch as th
from stable_baselines3.common.callbacks import BaseCallback

from sb3_ippo.common.logs import MIN_PRINT_EVERY, TABLES_PER_LEARN, print_every
from sb3_ippo.common.threads import LEARN_THREADS, chosen_threads
from tests.helpers import make_model


class ThreadsDuringSteps(BaseCallback):
    def __init__(self) -> None:
        super().__init__()
        self.seen: set[int] = set()

    def _on_step(self) -> bool:
        self.seen.add(th.get_num_threads())
        return True


@pytest.fixture
def torch_default_threads(monkeypatch: pytest.MonkeyPatch) -> Iterator[int]:
    """torch as a fresh process has it (tests/conftest.py sets one thread): intra-op count = inter-op count, and no
    thread variable. Yields that count; the test process's count is restored afterwards."""
    for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
        monkeypatch.delenv(name, raising=False)
    before = th.get_num_threads()
    default = th.get_num_interop_threads()
    if default == LEARN_THREADS:
        pytest.skip("torch's default here is already learn's thread count: nothing to choose")
    th.set_num_threads(default)
    try:
        yield default
    finally:
        th.set_num_threads(before)


def test_learn_runs_with_one_thread_where_torch_has_its_default_and_gives_the_default_back(
    torch_default_threads: int,
) -> None:
    assert chosen_threads() is None
    steps = ThreadsDuringSteps()

    make_model(async_training=False).learn(40, callback=steps)

    assert steps.seen == {LEARN_THREADS}
    assert th.get_num_threads() == torch_default_threads


def test_learn_keeps_a_thread_count_the_user_set(torch_default_threads: int) -> None:
    chosen = torch_default_threads + 1
    th.set_num_threads(chosen)
    steps = ThreadsDuringSteps()

    make_model(async_training=False).learn(40, callback=steps)

    assert steps.seen == {chosen}
    assert th.get_num_threads() == chosen


def test_learn_keeps_the_thread_count_of_omp_num_threads(
    torch_default_threads: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("OMP_NUM_THREADS", str(torch_default_threads))

    assert chosen_threads() == torch_default_threads


def test_learn_gives_the_default_back_when_it_fails(torch_default_threads: int) -> None:
    class Fail(BaseCallback):
        def _on_step(self) -> bool:
            raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        make_model(async_training=False).learn(40, callback=Fail())

    assert th.get_num_threads() == torch_default_threads


def test_print_every_gives_about_ten_tables_a_learn_and_never_more_often_than_the_minimum() -> None:
    assert print_every(200_000) == 200_000 // TABLES_PER_LEARN
    assert print_every(5_000) == MIN_PRINT_EVERY


def tables(text: str) -> int:
    return text.count("| time/")


def test_verbose_1_prints_a_table_at_the_first_update_then_every_print_every_env_steps_and_a_closing_line(
    capsys: pytest.CaptureFixture[str],
) -> None:
    # Short episodes, an update every 2 of them: over a thousand updates in 20,000 env steps.
    model = make_model(verbose=1, async_training=False, n_epochs=1)

    model.learn(20_000)

    out = capsys.readouterr().out
    assert model._n_updates > 1_000
    # The first dump, then the first at or after 10,000 (and 20,000, if a dump falls exactly there).
    assert 2 <= tables(out) <= 1 + 20_000 // MIN_PRINT_EVERY
    last_line = out.strip().splitlines()[-1]
    assert last_line.startswith("IPPO learned 20,000 env steps in ") and "team return" in last_line


def test_verbose_2_prints_every_dump_as_sb3_does(capsys: pytest.CaptureFixture[str]) -> None:
    model = make_model(verbose=2, async_training=False)

    model.learn(80, log_interval=1)

    assert tables(capsys.readouterr().out) == model._n_updates


def test_verbose_0_prints_nothing(capsys: pytest.CaptureFixture[str]) -> None:
    make_model(verbose=0, async_training=False).learn(80)

    assert capsys.readouterr().out == ""

