"""The torch thread count of IPPO's own processes during ``learn``.

torch's default, one intra-op thread per core, is several times slower than one thread for the small networks of
multi-agent RL on a few cores, and slower still when collection and the learner process each take every core
(``docs/benchmarks.md``, "As written"). So ``learn`` runs with one thread in the calling process and in the learner
process, and gives the caller's count back when it returns, unless the user has chosen a count: set
``OMP_NUM_THREADS`` (or ``MKL_NUM_THREADS``) or called ``torch.set_num_threads`` with a count other than torch's
default. Then ``learn`` keeps that count, and the learner process uses it too.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

import torch as th

# The thread count learn chooses where the user has not chosen one.
LEARN_THREADS = 1
# The variables through which torch (OpenMP, MKL) takes a thread count from the environment.
THREAD_VARIABLES = ("OMP_NUM_THREADS", "MKL_NUM_THREADS")


def chosen_threads() -> int | None:
    """The torch thread count the user chose for this process, or None where torch runs with its default."""
    if any(os.environ.get(name) for name in THREAD_VARIABLES):
        return th.get_num_threads()
    # torch sizes its intra-op and inter-op pools alike by default (one thread per physical core);
    # torch.set_num_threads changes only the intra-op count. Reading the inter-op count does not start its pool.
    if th.get_num_threads() != th.get_num_interop_threads():
        return th.get_num_threads()
    return None


@contextlib.contextmanager
def learn_threads() -> Iterator[int]:
    """Run the block with the thread count of ``learn`` (the user's, or ``LEARN_THREADS``); yields that count. The
    caller's count is restored afterwards."""
    chosen = chosen_threads()
    if chosen is not None:
        yield chosen
        return
    previous = th.get_num_threads()
    th.set_num_threads(LEARN_THREADS)
    try:
        yield LEARN_THREADS
    finally:
        th.set_num_threads(previous)
