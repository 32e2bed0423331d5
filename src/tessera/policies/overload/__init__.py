"""KunServe's overload loop: when KV demand overflows, which layers to drop, and how to restore.

The monitor, the drop plan, the ordered drop/restore steps, held groups, the desired state while
a drop is active, the KV exchange and lookahead microbatching. Run by the overload loop in control/.
"""
