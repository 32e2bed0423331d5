"""tessera.rpc.v1 generated stubs."""
