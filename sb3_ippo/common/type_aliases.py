"""The type aliases every layer shares (the env layer, the buffers, the update), in a module that imports nothing
heavy: the learner process imports the update code without the env layer."""

from __future__ import annotations

import numpy as np

AgentID = str
ObsArray = np.ndarray | dict[str, np.ndarray]
