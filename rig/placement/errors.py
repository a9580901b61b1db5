"""The ways the cluster can fall short: each is one line for the user."""

from __future__ import annotations


class ClusterError(RuntimeError):
    """The cluster cannot be reached or cannot host the run; the message is one line."""


class PlacementError(ClusterError):
    """The cluster cannot host the run as asked; one line saying what is missing."""
