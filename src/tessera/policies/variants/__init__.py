"""BlockLLM's block zoo across fine-tuned variants: sharing, stitching, speculation, placement.

Variant plans and memory, stitched chains, speculation thresholds and locality-aware placement.
Used by the reconcile, the agents and the simulator.
"""
