"""What an agent runs next and with which resources.

Continuous and per-block batching, GPU memory budgets, CPU shares of `tessera up` and the
restart back-off of local agents. Used by the engine scheduler, the agent and the CLI.
"""
