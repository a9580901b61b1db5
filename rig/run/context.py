"""The objects every step of a run shares, built once by the Runner."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from rig.config import RunSpec
from rig.run.fleet import Fleet
from rig.run.manifest_store import ManifestStore
from rig.run.progress import Progress
from rig.run.signals import StopControl


@dataclass(frozen=True)
class RunContext:
    """One run's spec, directory, manifest, progress display, stop control, fleet, API key and the values of the
    ``${NAME}`` references in its server settings (both read from the environment, never stored)."""

    spec: RunSpec
    run_dir: Path
    store: ManifestStore
    progress: Progress
    stop: StopControl
    fleet: Fleet
    api_key: str | None
    server_env: dict[str, str] = field(default_factory=dict)
