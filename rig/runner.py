"""Compatibility: the runner now lives in the rig.run package (one module per job); these are its old names."""

from rig.run.errors import RunError, RunInputError
from rig.run.fleet import corpus_mismatch
from rig.run.plans import split_closed, split_open
from rig.run.points import Point, expand_points, point_id
from rig.run.progress import Progress
from rig.run.runner import Runner

__all__ = ["Point", "Progress", "RunError", "RunInputError", "Runner", "corpus_mismatch", "expand_points",
           "point_id", "split_closed", "split_open"]
