"""Pure decisions: policies are functions over frozen dataclasses returning decision
dataclasses, with no torch, grpc or kopf, so a cluster simulator can import them.

The agent, gateway and operator only apply what these modules decide.
"""
