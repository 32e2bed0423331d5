"""The gateway's routing rule, re-exported from `tessera.policies.routing` (where the pure
logic lives so that the cluster simulator can import it without the gateway)."""

import sys

from tessera.policies import routing as _routing
from tessera.policies.routing import (
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

# One module, two names: `tessera.gateway.router` *is* `tessera.policies.routing`, so
# settings patched or read under either name (e.g. PREFIX_ENTRIES) are the same object.
sys.modules[__name__] = _routing
