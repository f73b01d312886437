"""Ctrl-C during ``train``: training stops, and the run is saved whole before the command exits with status 130.

A Ctrl-C while the run is being saved does not stop the save (it says so); one more does, and even then no file is
left half-written: each is written beside its final name and renamed onto it once complete.
"""

from __future__ import annotations

import contextlib
import os
import pathlib
import signal
import sys
import threading
from collections.abc import Iterator
from types import FrameType

EXIT_INTERRUPTED = 130  # 128 + SIGINT: what a shell reports for a command stopped by Ctrl-C


class RunInterrupted(Exception):
    """Ctrl-C stopped the command; the message says what was kept and how to go on. ``main`` prints it (no
    traceback) and exits with :data:`EXIT_INTERRUPTED`."""


@contextlib.contextmanager
def ctrl_c_deferred(what: str) -> Iterator[None]:
    """Within: the first Ctrl-C prints that ``what`` is being saved and lets it go on; a second one stops it (a
    KeyboardInterrupt, as usual). Only in the main thread, the only one that may set a signal's handler."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    presses = 0

    def on_ctrl_c(signum: int, frame: FrameType | None) -> None:
        nonlocal presses
        presses += 1
        if presses > 1:
            raise KeyboardInterrupt
        print(f"Still saving {what}: a moment (Ctrl-C again stops it; no file is left half-written)", file=sys.stderr)

    previous = signal.signal(signal.SIGINT, on_ctrl_c)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def written_whole(path: pathlib.Path) -> Iterator[pathlib.Path]:
    """A temporary path beside ``path`` (same suffix) to write to, renamed onto ``path`` when the block ends without
    error, and removed otherwise: ``path`` is either its earlier content or the complete new one, never a part."""
    partial = path.with_name(f".{path.stem}.partial{path.suffix}")
    try:
        yield partial
        if partial.exists():
            os.replace(partial, path)
    finally:
        partial.unlink(missing_ok=True)
