"""The simulated SGLang server: a calibrated discrete-event model of continuous batching with speculative decoding.

Start it like ``sglang.launch_server``: ``python -m rig.sim --model-path M [SGLang flags] [--sim-* flags]``.
"""
