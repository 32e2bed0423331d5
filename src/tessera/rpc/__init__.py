"""Generated gRPC/protobuf stubs for the agent contract; regenerate with `make proto`."""
