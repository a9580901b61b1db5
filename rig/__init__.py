"""rig: a distributed test rig for LLM serving with speculative decoding."""

__version__ = "0.1.0"
