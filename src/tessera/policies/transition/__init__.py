"""Live reconfiguration: from what the agents hold to a desired plan without losing a request.

The transition planner, its model and step builder, shrink- and drop-style transitions, the
action vocabulary, drains, generations, device mapping, shards and copy sources. Run by the
reconcile (control/converge.py) in the operator and in `tessera up`.
"""
