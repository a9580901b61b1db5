"""What a run spec will do that a user might not expect: said before the run starts (one 'note:' line each), never
an error."""

from __future__ import annotations

from rig.config import RunSpec, as_it_runs
from rig.workloads.spec import WorkloadSpec


def notices(spec: RunSpec) -> list[str]:
    """What the spec will do that a user might not expect (said before the run starts, not an error)."""
    out = []
    if spec.server.engine == "command":
        from rig.server.command import uses_speculation

        if not uses_speculation(spec.server):
            out.append(
                f"server.command places no {{steps}}: steps {','.join(map(str, spec.steps))} is recorded on "
                f"every row, not given to the server"
            )
    asked = spec.asked_configs()
    changed = [c for c in asked if as_it_runs(c).num_draft_tokens != c.num_draft_tokens]
    if any(c.spec_schedule is not None and c.steps == 0 for c in asked):
        out.append(
            "steps 0 runs no speculation, so its configuration runs without spec_schedule (the no-speculation "
            "baseline); the other steps values run the schedule"
        )
    if changed:
        c = changed[0]
        out.append(
            f"num_draft_tokens={c.num_draft_tokens} at steps {c.steps} (eagle_topk {c.eagle_topk}) runs "
            f"{as_it_runs(c).num_draft_tokens}: SGLang uses steps + 1 with eagle_topk 1 and none without "
            f"speculation (speculative_hook.py); {len(changed)} of {len(asked)} configuration(s) are planned "
            f"and recorded as they run, {len(spec.server_configs())} launched"
        )
    n = spec.load.requests
    above = [c for c in (spec.load.concurrency if spec.load.mode == "closed" else []) if n is not None and c > n]
    if above:
        out.append(
            f"--requests {n} is below concurrency {', '.join(map(str, above))}: at most {n} requests are ever "
            f"in flight there, so such a level measures concurrency {n} (give --requests >= the concurrency, "
            f"or --duration)"
        )
    for wl in spec.workloads:
        if wl.name != "dataset":
            continue
        from rig.workloads.datafile import skipped_entries
        from rig.workloads.dataset import size

        if wl.path is None:  # WorkloadSpec's validator requires it for the dataset workload
            raise ValueError("the dataset workload needs a path")
        n = size(wl)
        if skipped_entries(wl.path):
            out.append(
                f"{wl.path}: {skipped_entries(wl.path)} ShareGPT conversation(s) without a human turn skipped; "
                f"{n} usable"
            )
        if spec.load.requests and spec.load.requests > n and not wl.cycle:
            out.append(
                f"{wl.path} has {n} usable entries: each level sends {n}, not --requests "
                f"{spec.load.requests} (--workload-opt cycle=true repeats the file)"
            )
        out += _dataset_notes(spec, wl, n)
    return out


def _dataset_notes(spec: RunSpec, wl: WorkloadSpec, n: int) -> list[str]:
    """A trace whose timestamps may not mean what they say; an open-loop level bound by a duration that asks for more
    sessions than the file holds (it runs out early: flagged dataset_exhausted)."""
    from rig.workloads.dataset import trace_notes

    load = spec.load
    if load.mode == "trace":
        return trace_notes(wl, load.trace_speed)
    short = [r for r in load.rates if load.duration_s and r * load.duration_s > n] if not wl.cycle else []
    if not short or load.requests is not None:
        return []
    return [
        f"{wl.path} has {n} usable entries, fewer than rate x duration at rate {', '.join(f'{r:g}' for r in short)}: "
        f"such a level runs out of them about {n / max(short):.0f} s into its {load.duration_s:g} s and is flagged "
        f"dataset_exhausted (--workload-opt cycle=true repeats the file)"
    ]
