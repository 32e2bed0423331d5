"""The agents' data plane: torch.distributed groups formed per replica, and transports.

`store` serves and reaches the TCPStore rendezvous; `group` forms one group on demand
(no global `init_process_group`); `gloo` and `nccl` make the backend for CPU and CUDA
devices; `grpc` names the gRPC fallback used where no group is shared.
"""
