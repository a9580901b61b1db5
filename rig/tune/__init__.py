"""Answering the campaign's question directly: SLO search (bracketing + bisection) and `rig tune` (model-guided)."""
