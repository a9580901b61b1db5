"""The one error type workloads raise for anything a user can cause."""

from __future__ import annotations


class WorkloadError(ValueError):
    """A user-caused workload problem; the message is one line (for datasets: file, line or entry, what is wrong)."""
