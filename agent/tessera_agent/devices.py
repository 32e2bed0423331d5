"""Devices an agent offers and the memory each loaded block holds on them.

Called once at agent start-up (`parse_devices`, `probe_nvml`) and by the servicer to check
budgets. NVIDIA GPUs come from NVML (nvidia-ml-py) when a driver exists; otherwise the
agent serves declared CPU virtual devices such as `cpu:2x4GiB`, and says why NVML is
absent. Asking for a GPU on a machine without one is an error, never a silent fallback.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from tessera.policies.serving import gpu_memory
from tessera_agent import gpu_devices

_UNITS = {
    "": 1,
    "B": 1,
    "KIB": 1 << 10,
    "MIB": 1 << 20,
    "GIB": 1 << 30,
    "TIB": 1 << 40,
    "KB": 10**3,
    "MB": 10**6,
    "GB": 10**9,
    "KI": 1 << 10,
    "MI": 1 << 20,
    "GI": 1 << 30,
}


class DeviceError(ValueError):
    """A device specification cannot be satisfied on this machine."""


def parse_bytes(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([A-Za-z]*)\s*", text)
    if not m or m.group(2).upper() not in _UNITS:
        raise DeviceError(f"cannot parse a memory size from {text!r} (e.g. 4GiB, 512MiB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).upper()])


@dataclass
class Device:
    id: str
    kind: str  # "cpu" or "cuda"
    name: str
    capacity_bytes: int
    used: dict[str, int] = field(default_factory=dict)  # holder ("replica/stage") -> bytes

    @property
    def free_bytes(self) -> int:
        return self.capacity_bytes - sum(self.used.values())

    def torch_device(self) -> torch.device:
        return torch.device("cpu") if self.kind == "cpu" else torch.device(self.id)


def host_copy(kind: str) -> Callable[[torch.Tensor], torch.Tensor]:
    """How a device of `kind` keeps a tensor in host memory (the host block cache): in
    pinned (page-locked) memory for CUDA, so copies back run at full PCIe speed and
    asynchronously; a CPU device's tensor already is in host memory and is kept as is."""
    if kind == "cuda":

        def pinned(t: torch.Tensor) -> torch.Tensor:
            out = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=True)
            out.copy_(t.detach())
            return out

        return pinned
    return lambda t: t.detach().cpu()


def probe_nvml() -> tuple[list[Device], str]:
    """GPUs visible through NVML, and "ok" or the reason NVML is absent."""
    try:
        import pynvml
    except ImportError:
        return [], "NVML unavailable: nvidia-ml-py is not installed"
    try:
        pynvml.nvmlInit()
    except Exception as exc:  # NVMLError_LibraryNotFound, DriverNotLoaded, ...
        return [], f"NVML unavailable: {exc} (no NVIDIA driver on this node)"
    try:
        out = []
        for i in range(pynvml.nvmlDeviceGetCount()):
            h = pynvml.nvmlDeviceGetHandleByIndex(i)
            name = pynvml.nvmlDeviceGetName(h)
            mem = pynvml.nvmlDeviceGetMemoryInfo(h)
            out.append(Device(f"cuda:{i}", "cuda", str(name), int(mem.total)))
        return out, "ok"
    finally:
        pynvml.nvmlShutdown()


def parse_devices(
    spec: str,
    gpu_memory_utilization: float = gpu_memory.DEFAULT_UTILIZATION,
    backend: gpu_devices.Backend | None = None,
    probe: Callable[[], tuple[list[Device], str]] = probe_nvml,
) -> tuple[list[Device], str]:
    """Devices from a flag: `cpu:2x4GiB`, `cpu:1x512MiB,cpu:1x1GiB`, `cuda` (all GPUs) or
    `auto` (GPUs when NVML finds some, else one 4 GiB CPU device). Returns (devices,
    nvml status). A GPU's capacity is its budget: `gpu_memory_utilization` x total less
    what is in use when measured through `backend` (torch's CUDA by default)."""
    gpu_memory.check_utilization(gpu_memory_utilization)
    gpus, status = probe()
    devices: list[Device] = []
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        if part == "auto":
            devices += gpus or [Device("cpu:0", "cpu", "virtual CPU device", 4 << 30)]
            continue
        if part == "cuda" or part.startswith("cuda:"):
            if not gpus:
                raise DeviceError(f"--devices {part}: no NVIDIA GPU is usable here ({status})")
            if part == "cuda":
                devices += gpus
            else:
                idx = int(part.split(":", 1)[1])
                if idx >= len(gpus):
                    raise DeviceError(f"--devices {part}: only {len(gpus)} GPUs present")
                devices.append(gpus[idx])
            continue
        m = re.fullmatch(r"cpu:(\d+)x(.+)", part)
        if not m:
            raise DeviceError(f"--devices: cannot parse {part!r} (expected e.g. cpu:2x4GiB, cuda)")
        first = sum(1 for d in devices if d.kind == "cpu")
        for i in range(int(m.group(1))):
            devices.append(
                Device(f"cpu:{first + i}", "cpu", "virtual CPU device", parse_bytes(m.group(2)))
            )
    if not devices:
        raise DeviceError("--devices: no device declared")
    cuda = [d for d in devices if d.kind == "cuda"]
    if cuda:
        backend = backend or gpu_devices.TorchCuda()
        why = gpu_devices.backend_problem(backend, len(gpus))
        if why is not None:
            raise DeviceError(f"--devices {spec}: {why}")
        lines = []
        for d in cuda:
            budget = gpu_devices.measure(
                int(d.id.split(":", 1)[1]), gpu_memory_utilization, backend
            )
            if budget.error:
                raise DeviceError(f"{d.id} ({d.name}): {budget.error}")
            d.capacity_bytes = budget.capacity_bytes
            lines.append(f"{d.id}: {budget.describe()}")
        status = f"{status}; budgets: {'; '.join(lines)}"
    return devices, status
