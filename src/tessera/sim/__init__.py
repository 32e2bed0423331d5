"""Discrete-event cluster simulator that runs Tessera's own decision code.

Simulated replicas batch with `tessera.policies.serving.batching`, account KV pages with
`tessera.kvpages`, take step times from `tessera.cost`, are placed by `tessera.planner` and
fed by `tessera.policies.routing.shares`; the control plane's pure policies (overload, drop plan)
are called as the operator calls them and their actions applied with modelled delays.
Every figure it produces is a simulation, not a measurement. Entry points: `tessera sim`
(`tessera.cli.sim_cmd`) and `tessera bench sim` (`tessera.sim.bench`). One concept per
module: arrivals, steptime, replica, engine, control, setup, report, plots, bench.
"""
