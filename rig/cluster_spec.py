"""The run spec's ``cluster`` section (rig.config.RunSpec.cluster): where things run."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field, field_validator


class ClusterSpec(BaseModel):
    """Where things run: the embedded default (local Ray) or a cluster file."""

    model_config = ConfigDict(extra="forbid")

    address: str | None = None  # None: start a local Ray instance
    server_label: dict[str, str] = Field(default_factory=dict)  # e.g. {"role": "server"}
    server_resource: str | None = None  # e.g. "blackwell"
    client_label: dict[str, str] = Field(default_factory=dict)  # e.g. {"role": "client"}
    client_resource: str | None = None  # e.g. "client" (one per client host)
    per_host: int = Field(1, ge=1, description="Generators per client host.")
    allow_generators_on_server_node: bool = True  # the embedded default runs everything on one node
    shared_results: bool | None = None  # None: detect (can each generator see the driver's results dir?)
    # Where generators write part files when the driver's results dir is not visible to them: a local directory
    # on each client host ({host}, {node_ip}, {node_id} are filled in there); the driver gathers through Ray.
    spool_dir: str = "/tmp/rig-spool"
    # A shared destination every generator writes to directly: a path on a shared filesystem (NFS) or a
    # pyarrow filesystem URI (s3://bucket/prefix, gs://...). The driver copies it into results/<run_id>/.
    results_uri: str | None = None
    placement_timeout_s: float = Field(60.0, gt=0)  # how long generators may wait for a free slot
    object_store_memory_mb: int = Field(256, ge=64)
    num_cpus: int | None = None  # local Ray only
    # What one GPU-hour of the server node costs (USD): rig report / compare turn it into $ per million output
    # tokens (their --gpu-hour-price overrides it).
    gpu_hour_price: float | None = Field(None, ge=0, allow_inf_nan=False)

    @field_validator("spool_dir")
    @classmethod
    def _spool_placeholders(cls, v: str) -> str:
        try:
            filled = v.format(host="h", node_ip="i", node_id="n")
        except (KeyError, IndexError, ValueError):
            raise ValueError("only the placeholders {host}, {node_ip} and {node_id} are allowed") from None
        if not filled.strip():
            raise ValueError("must be a directory path")
        return v

    @field_validator("results_uri")
    @classmethod
    def _uri(cls, v: str | None) -> str | None:
        if v is not None and not v.strip():
            raise ValueError("give a shared path or a URI such as s3://bucket/prefix")
        if v is not None and "://" not in v and not v.startswith("/"):
            raise ValueError("a shared path must be absolute (every host resolves it on its own)")
        return v.rstrip("/") if v else v
