"""Tessera agent: per-node gRPC server hosting the block engine."""
