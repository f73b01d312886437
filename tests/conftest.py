import os

# The butterfly envs import pygame, which needs no display with the dummy video driver.
os.environ.setdefault("SDL_VIDEODRIVER", "dummy")
os.environ.setdefault("PYGAME_HIDE_SUPPORT_PROMPT", "1")
