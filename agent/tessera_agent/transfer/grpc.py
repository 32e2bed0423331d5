"""The gRPC fallback transport: what moves bytes when two ends share no group.

Stage activations then travel on the `StageStream` RPC (`stage_client` / `stage_server`),
block copies on `FetchTensors` (`tensor_transfer`) and KV on `ExportKV`/`ImportKV`
(`kv_transfer`). This module only names the fallback, so `Describe` and the benches report
one vocabulary of transports: `nccl`, `gloo`, `grpc`.
"""

from __future__ import annotations

NAME = "grpc"
