"""What every benchmark shares: the harness, the HTTP/SSE client, the trace and `tessera up`.

A benchmark is a module with ``add_arguments(parser)`` and ``run(args) -> dict``, listed in
`tessera.cli.bench.BENCHES`, holding only its scenario. Shared here, one concept a module:
`harness` (interleaved rounds, medians of per-round ratios, percentiles, the quiet-machine
check, provenance on every JSON); `client` (the one SSE client of the gateway's OpenAI API);
`trace` (the shared conversation trace); `options` (shared command-line options); `local_up`
(a tiny checkpoint and a `tessera up` process); `oracle` (greedy `transformers` texts).
Benchmarks live in `tessera.cli.bench_*` (serving), `tessera_agent.bench_*` (engine, data
plane) and beside what they measure (docs/benchmarks.md). This package imports no agent,
operator or CLI code.
"""
