"""Cost model: how long a transformer layer takes and how much memory it needs.

Pure code over plain dataclasses, no I/O. The planner (``tessera.planner``) calls it to
turn a deployment candidate into per-class request capacities; ``tessera profile`` (the
CLI) feeds it measured layer timings through :func:`tessera.cost.fit.fit_profile`.
Modules: ``model_shape`` (dimensions from a Hugging Face ``config.json``), ``profile``
(the per-layer cost profile, its JSON schema), ``analytic`` (profiles from peak FLOP/s and
HBM bandwidth), ``fit`` (least-squares fit to measured timings), ``latency`` (per-stage
prefill/decode, TP all-reduce, PP hops), ``capacity`` (one replica's sustainable rate per
class), ``queueing`` (tail-latency math), ``calibration`` / ``profile_calibration`` (the
model's error against measured latencies).
"""
