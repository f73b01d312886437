"""The learner process of ``async_training``: every update of one ``learn`` runs in a child process while collection
goes on.

:class:`LearnerProcess` sends the pickled :class:`~sb3_ippo.update.trainer.Trainer` to a child process once per
``learn``; from then on only the drained trajectories and the update's settings go in (:class:`UpdateJob`) and only
the trained weights, optimizer states, return statistics and update statistics come back (:class:`UpdateResult`).
The child keeps its copies of the policies between updates: it is the only trainer, and the model applies each result
at a deterministic point (``IPPO._finish_update_in_flight``), so both hold the same weights once a result is applied.
This module imports the update code only: not the env layer.
"""

from __future__ import annotations

import ast
import contextlib
import multiprocessing
import os
import pickle
import signal
import sys
import threading
import traceback
from collections.abc import Iterator
from multiprocessing.connection import Connection

import torch as th

from sb3_ippo.update.trainer import Trainer, UpdateJob, UpdateResult

# How long ``LearnerProcess.close`` waits for the learner to stop on its own before terminating it.
STOP_TIMEOUT = 5.0
# ``async_training="auto"`` starts a learner for a ``learn`` of at least this many env steps: starting one takes a
# second or two (a fresh interpreter imports torch), which a shorter run would not win back.
AUTO_MIN_TIMESTEPS = 20_000


def available_cores() -> int:
    """The CPU cores this process may run on."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def why_no_learner() -> str | None:
    """Why this process cannot usefully run a learner process beside it (None: it can): a single core, or a daemonic
    process (a ``multiprocessing.Pool`` worker), which may not start processes."""
    if multiprocessing.current_process().daemon:
        return "this is a daemonic process (e.g. a multiprocessing.Pool worker), which may not start processes"
    if available_cores() < 2:
        return "this process has a single CPU core, which collection and the learner would share"
    return None


def _learner_main(connection: Connection, threads: int) -> None:
    """The learner process: receive the trainer, then answer each job with its result until told to stop (None) or
    the connection closes. An exception in an update is sent back as its traceback, and the process ends."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C is for the main process, which then stops this one.
    th.set_num_threads(threads)
    th.manual_seed(0)  # Nothing in an update should draw from it; if something does, runs stay reproducible.
    try:
        trainer: Trainer = pickle.loads(connection.recv_bytes())
        while True:
            job: UpdateJob | None = pickle.loads(connection.recv_bytes())
            if job is None:
                # Told to stop, with every result sent: nothing is left to flush, and skipping the interpreter's
                # teardown (torch's modules, about 0.4 s) lets learn() return at once.
                connection.close()
                os._exit(0)
            result = trainer.result(trainer.update(job))
            connection.send_bytes(pickle.dumps(("result", result), protocol=pickle.HIGHEST_PROTOCOL))
    except (EOFError, BrokenPipeError, KeyboardInterrupt):
        return  # The main process is gone or stopping us.
    except BaseException:
        try:
            connection.send_bytes(pickle.dumps(("error", traceback.format_exc())))
        except OSError:
            pass


@contextlib.contextmanager
def _ctrl_c_ignored_from_the_start() -> Iterator[None]:
    """While a child process is started, ignore SIGINT here: the child inherits that from its first instruction (as
    Python does not install its Ctrl-C handler over an ignored SIGINT). Ctrl-C at a terminal reaches the whole
    process group, and would otherwise interrupt the child's imports with a traceback of its own; the parent decides
    when the child stops. A Ctrl-C in these few milliseconds is lost. Only in the main thread, the only one that may
    set a signal's handler."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


@contextlib.contextmanager
def _main_module_hidden(hide: bool) -> Iterator[None]:
    """While a process is started, hide the main module's file and spec from ``multiprocessing``'s spawn, which would
    otherwise have the child run the main script again (as ``__mp_main__``) to find what it defines: a script without
    ``if __name__ == "__main__":`` would start training again there. Only for a learner whose trainer needs nothing
    defined in ``__main__``."""
    main = sys.modules["__main__"]
    saved: dict[str, object] = {}
    if hide:
        saved["__spec__"] = main.__dict__.get("__spec__")
        main.__dict__["__spec__"] = None
        if "__file__" in main.__dict__:
            saved["__file__"] = main.__dict__.pop("__file__")
    try:
        yield
    finally:
        main.__dict__.update(saved)


def needs_main_module(payload: bytes) -> bool:
    """Whether unpickling ``payload`` may need the main module: a class or function that the running script (or
    notebook) defined, which pickle names by reference to ``__main__``. (A string "__main__" in the data also counts:
    then the learner imports the main script, as it always may.)"""
    return b"__main__" in payload


def guards_main(path: str) -> bool:
    """Whether the script at ``path`` runs its top-level work under ``if __name__ == "__main__":`` (a file that cannot
    be read or parsed counts as guarded: then nothing is refused on a guess)."""
    try:
        with open(path, encoding="utf-8") as file:
            tree = ast.parse(file.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return True
    for node in tree.body:
        if isinstance(node, ast.If) and isinstance(node.test, ast.Compare) and len(node.test.comparators) == 1:
            sides = [node.test.left, node.test.comparators[0]]
            names = [side.id for side in sides if isinstance(side, ast.Name)]
            constants = [side.value for side in sides if isinstance(side, ast.Constant)]
            if names == ["__name__"] and constants == ["__main__"]:
                return True
    return False


class LearnerProcess:
    """One child process (torch multiprocessing, spawn start method) that runs every update of one ``learn``.

    The child imports ``sb3_ippo.update`` and what the trainer's classes need, not the main script, unless the trainer
    holds something the script defined (a policy or features extractor class written in it): so a script without
    ``if __name__ == "__main__":``, and a notebook, can train with ``async_training`` as long as their classes come
    from importable modules.

    :param trainer: Pickled and sent once; the child trains its copy from then on.
    :param threads: The child's torch thread count (``learn``'s: ``sb3_ippo.common.threads``).
    :raises TypeError: if the trainer cannot be pickled (e.g. a policy holding a lambda), naming what to change.
    :raises RuntimeError: if the trainer holds a class defined in an interactive session (a notebook), which no other
        process can import, or in a script without ``if __name__ == "__main__":``, which the learner cannot import
        without starting its training again: define it in a module, or train with ``async_training=False``; and in a
        daemonic process, which may not start one.
    """

    def __init__(self, trainer: Trainer, threads: int = 1) -> None:
        try:
            payload = pickle.dumps(trainer, protocol=pickle.HIGHEST_PROTOCOL)
        except (pickle.PicklingError, TypeError, AttributeError) as error:
            raise TypeError(
                "async_training sends the policies to a learner process, which needs them picklable, and they are not "
                f"({error}). Use picklable policy_kwargs (classes and functions defined at module level, no lambdas) "
                "or async_training=False."
            ) from error
        main_file = getattr(sys.modules["__main__"], "__file__", None)
        main_spec = getattr(sys.modules["__main__"], "__spec__", None)
        # A notebook's or the prompt's main module has no file another process could run (python - gives "<stdin>").
        interactive = main_spec is None and (main_file is None or not os.path.isfile(main_file))
        needs_main = needs_main_module(payload)
        if needs_main and interactive:
            raise RuntimeError(
                "async_training sends the policies to a learner process, and they use a class defined in this "
                "interactive session (a notebook or the Python prompt), which another process cannot import. Define "
                "it in a module (a .py file you import), or use async_training=False."
            )
        if needs_main and not interactive and main_file is not None and not guards_main(main_file):
            raise RuntimeError(
                f"async_training sends the policies to a learner process, and they use a class defined in the script "
                f"{main_file} itself, so the learner must import it; the script has no `if __name__ == \"__main__\":`, "
                "so importing it would start its training again there. Put the training code under that guard, define "
                "the class in a module you import, or use async_training=False."
            )
        if multiprocessing.current_process().daemon:
            raise RuntimeError(
                "async_training starts a learner process, which a daemonic process (e.g. a multiprocessing.Pool worker) "
                "may not do: use async_training=False or \"auto\" there, or run training in a non-daemonic process"
            )
        context = th.multiprocessing.get_context("spawn")
        self._connection, child_connection = context.Pipe()
        self.process = context.Process(
            target=_learner_main, args=(child_connection, threads), name="ippo-learner", daemon=True
        )
        with _main_module_hidden(not needs_main), _ctrl_c_ignored_from_the_start():
            self.process.start()
        child_connection.close()
        self._updates = 0
        # The child reads the trainer only once it has imported torch (a second or two): sending it from a thread lets
        # collection start meanwhile.
        self._sending = threading.Thread(target=self._send_quietly, args=(payload,), name="ippo-learner-send", daemon=True)
        self._sending.start()

    def _send_quietly(self, payload: bytes) -> None:
        try:
            self._connection.send_bytes(payload)
        except OSError:
            pass  # The learner died: result() says so.

    def _send(self, payload: bytes) -> None:
        self._sending.join()
        try:
            self._connection.send_bytes(payload)
        except OSError as error:
            raise self._died() from error

    def _died(self) -> RuntimeError:
        self.process.join(timeout=1.0)
        return RuntimeError(
            f"The async_training learner process (pid {self.process.pid}) died (exit code {self.process.exitcode}) "
            f"during update {self._updates}: the model keeps its last applied weights (save it, or learn again, which "
            "starts a new learner). A negative exit code is the signal that killed it (-9: killed, e.g. out of memory). "
            "Exit code 1 at the first update usually means a script without `if __name__ == \"__main__\":`: the learner "
            "is started with the spawn method, which imports the main module again."
        )

    def submit(self, job: UpdateJob) -> None:
        """Send one update's work; the observation statistics are pickled as they are now."""
        self._updates += 1
        self._send(pickle.dumps(job, protocol=pickle.HIGHEST_PROTOCOL))

    def result(self, poll_interval: float = 0.05) -> UpdateResult:
        """Wait for the submitted update's result.

        :raises RuntimeError: promptly if the learner raised (with its traceback) or died.
        """
        while not self._connection.poll(poll_interval):
            if not self.process.is_alive():
                if self._connection.poll(0):  # It may have sent its last words as it ended.
                    break
                raise self._died()
        try:
            kind, payload = pickle.loads(self._connection.recv_bytes())
        except (EOFError, OSError) as error:
            raise self._died() from error
        if kind == "error":
            raise RuntimeError(
                f"The async_training learner process failed in update {self._updates}; the model keeps its last "
                f"applied weights. The learner's traceback:\n{payload}"
            )
        return payload

    def close(self, timeout: float = STOP_TIMEOUT) -> None:
        """Stop the learner: ask it to end, wait up to ``timeout`` seconds, then terminate it, then kill it."""
        if self.process.is_alive() and timeout > 0:
            try:
                self._connection.send_bytes(pickle.dumps(None))
            except OSError:
                pass
            self.process.join(timeout)
        for stop in (self.process.terminate, self.process.kill):
            if not self.process.is_alive():
                break
            stop()
            self.process.join(1.0)
        self._connection.close()
