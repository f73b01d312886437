import os

# The butterfly envs import pygame, which needs no display with the dummy video driver.
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")

import torch as th

# The tests use tiny networks: on a 2-core machine they run several times faster on one torch thread than on
# threads competing with the env and with each other.
th.set_num_threads(1)
