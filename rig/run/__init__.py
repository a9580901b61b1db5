"""Running a RunSpec, one module per job: points -> plans -> run directory and manifest -> fleet and server -> execute.

`rig.run.runner.Runner` is the orchestrator; the other modules each hold one step it calls.
"""
