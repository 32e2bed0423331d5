"""What every benchmark shares: the harness, the HTTP/SSE client, the trace and `tessera up`.

A benchmark is a module with ``add_arguments(parser)`` and ``run(args) -> dict``, listed
in `tessera.cli.bench.BENCHES` (`tessera bench NAME --json`). Each one holds only its
scenario; what two of them would otherwise copy lives here, one concept a module:

- `harness`: interleaved rounds, medians of per-round ratios, percentiles, the
  quiet-machine check and the provenance (machine, commit, date) stamped on every JSON;
- `client`: the one streaming client of the gateway's OpenAI-compatible API (SSE);
- `trace`: the shared conversation trace, scaled into (arrival, prompt, output) rows;
- `options`: the command-line options several benchmarks share (seed, rate, tiny model,
  `--via`);
- `local_up`: a tiny checkpoint and a `tessera up` process to drive;
- `oracle`: greedy `transformers` texts, the correctness check of served tokens.

Where benchmarks live (also in `docs/benchmarks.md`): serving scenarios under
`tessera.cli.bench_*`; engine and data-plane ones in the agent (`tessera_agent.bench_*`,
they need torch and the engine; they use `harness` and `client`, which import nothing of
the CLI); pure ones beside what they measure (`tessera.planner.bench`,
`tessera.workload.bench`, `tessera.policies.transition.plan_bench`, `tessera.sim.bench`,
`tessera_operator.bench_reconcile`). This package imports no agent, operator or CLI code.
"""
