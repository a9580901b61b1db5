"""``python -m rig.sim``: a drop-in for ``python -m sglang.launch_server``."""

from rig.sim.launch import main

if __name__ == "__main__":
    main()
