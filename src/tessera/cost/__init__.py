"""Cost model: how long a transformer layer takes and how much memory it needs.

Pure code over plain dataclasses, no I/O. The planner (``tessera.planner``) calls it to
turn a deployment candidate into per-class request capacities; ``tessera profile`` (the
CLI) feeds it measured layer timings through :func:`tessera.cost.fit.fit_profile`.

Modules, one concept each:

* ``fields``       -- validation errors that name the offending field (``a.b[2].c``).
* ``model_shape``  -- transformer dimensions read from a Hugging Face ``config.json``.
* ``profile``      -- the per-layer cost profile and its JSON schema.
* ``analytic``     -- profiles derived from peak FLOP/s and HBM bandwidth (A100, H100).
* ``fit``          -- least-squares fit of a profile from measured layer timings.
* ``latency``      -- per-stage prefill/decode time, TP all-reduce and PP hop costs.
* ``capacity``     -- sustainable request rate of one replica for one workload class.
"""
