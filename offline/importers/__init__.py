"""Trajectory importers: other harnesses' agent logs as neutral transcripts.

``load_trajectories(*paths)`` reads files and folders, detecting each file's format from
its content; ``detect_format(path)`` says which format a file is in.
"""

from offline.importers.base import (
    MessageTime,
    Trajectory,
    TrajectoryFormatError,
    TrajectoryWarning,
)
from offline.importers.detect import LOADERS, detect_format, load_trajectories

__all__ = [
    "LOADERS",
    "MessageTime",
    "Trajectory",
    "TrajectoryFormatError",
    "TrajectoryWarning",
    "detect_format",
    "load_trajectories",
]
