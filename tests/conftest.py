import os
import signal
from collections.abc import Iterator

# The butterfly envs import pygame, which needs no display with the dummy video driver.
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")

import pytest
import torch as th

# The checks in tests/helpers.py report like the tests' own asserts: registered before anything imports it.
pytest.register_assert_rewrite("tests.helpers")

from tests.helpers import fail_after  # noqa: E402 (after the registration above)

# The tests use tiny networks: on a 2-core machine they run several times faster on one torch thread than on
# threads competing with the env and with each other.
th.set_num_threads(1)

# The Ctrl-C tests send this process SIGINT and expect Python's own handler. A shell starts a background job
# (`nohup pytest ... &`) with SIGINT ignored, and Python then keeps it ignored: give the tests Python's handler back.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


@pytest.fixture
def no_hang() -> Iterator[None]:
    """Fails the test with a TimeoutError, instead of hanging the test run, if it takes more than 30 seconds."""
    with fail_after(30):
        yield
