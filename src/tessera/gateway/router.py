"""The gateway's routing rule, re-exported from `tessera.policies.routing.shares` (where the pure
logic lives so that the cluster simulator can import it without the gateway). Settings
such as PREFIX_ENTRIES are read from `tessera.policies.routing.shares`: patch them there."""

from tessera.policies.routing.shares import (
    PREFIX_ENTRIES,
    PREFIX_MIN,
    ClassRouter,
    ClassShares,
    Route,
    Router,
    SupportsClassify,
    Ticket,
    centroid_class_router,
    workload_class_router,
)

__all__ = [
    "PREFIX_ENTRIES",
    "PREFIX_MIN",
    "ClassRouter",
    "ClassShares",
    "Route",
    "Router",
    "SupportsClassify",
    "Ticket",
    "centroid_class_router",
    "workload_class_router",
]
