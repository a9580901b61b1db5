"""The errors a run raises to the CLI (each with a one-line message for the user)."""

from __future__ import annotations


class RunError(RuntimeError):
    """A run-level failure with a one-line message for the user."""


class RunInputError(RunError):
    """A run refused before it starts because of what the user asked for (the CLI exits 2)."""
