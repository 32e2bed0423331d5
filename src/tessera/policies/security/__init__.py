"""Who may do what: agent RPC access rules, certificate tenancy and spec admission (pure).

Used by the agent servicer's interceptor, the gateway and the operator's admission checks.
"""
