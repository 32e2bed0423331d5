"""Containers without a container engine: an image's root filesystem, processes run inside it.

`Container.create(image)` makes a buildah working container of a built image and mounts its
root filesystem (`buildah from` + `buildah mount`); `spawn` runs a command there through
scripts/image/run-in-rootfs.sh under `unshare --mount`: read-only root filesystem, uid/gid
10001, tmpfs /tmp, the image's environment and working directory, read-only bind mounts —
how the chart's pods run. The host's network is shared (127.0.0.1 ports). Caller:
tests/image/image_check.py (`make image-check`); needs root and buildah.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RUNNER = ROOT / "scripts" / "image" / "run-in-rootfs.sh"


def buildah(*args: str) -> str:
    """Run buildah; its stdout, stripped. Raises with its stderr on failure."""
    proc = subprocess.run(["buildah", *args], capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"buildah {' '.join(args)}: {proc.stderr.strip()}")
    return proc.stdout.strip()


def image_size(image: str) -> int:
    """Bytes of an image: the sum of its layers (uncompressed tars) in its manifest."""
    manifest = json.loads(json.loads(buildah("inspect", "--type", "image", image))["Manifest"])
    return sum(int(layer["size"]) for layer in manifest["layers"])


@dataclass
class Container:
    """A working container of `image` with its root filesystem mounted at `rootfs`."""

    image: str
    name: str
    rootfs: Path
    env: list[str]  # the image's config Env, NAME=VALUE

    @classmethod
    def create(cls, image: str, name: str) -> Container:
        subprocess.run(["buildah", "rm", name], capture_output=True, check=False)  # a leftover
        buildah("from", "--pull=never", "--name", name, image)
        rootfs = Path(buildah("mount", name))
        config = json.loads(buildah("inspect", "--type", "image", image))["OCIv1"]["config"]
        return cls(image, name, rootfs, list(config.get("Env") or []))

    def remove(self) -> None:
        subprocess.run(["buildah", "umount", self.name], capture_output=True, check=False)
        subprocess.run(["buildah", "rm", self.name], capture_output=True, check=False)

    def command(
        self,
        argv: Sequence[str],
        binds: Sequence[tuple[Path, str]],
        workdir: Path,
        env: Sequence[str] = (),
    ) -> list[str]:
        """The host command line that runs `argv` inside this container."""
        new_root = tempfile.mkdtemp(prefix="root.", dir=workdir)
        return [
            "unshare", "--mount", "--", str(RUNNER), str(self.rootfs), new_root,
            *(f"{src}:{dst}" for src, dst in binds), "--",
            *self.env, *env, *argv,
        ]  # fmt: skip

    def run(
        self,
        argv: Sequence[str],
        workdir: Path,
        binds: Sequence[tuple[Path, str]] = (),
        timeout: float = 120.0,
    ) -> subprocess.CompletedProcess[str]:
        """Run a short command to completion; stdout and stderr captured."""
        return subprocess.run(
            self.command(argv, binds, workdir), capture_output=True, text=True,
            timeout=timeout, check=False,
        )  # fmt: skip

    def spawn(
        self,
        argv: Sequence[str],
        workdir: Path,
        binds: Sequence[tuple[Path, str]] = (),
        env: Sequence[str] = (),
    ) -> Process:
        """Start a long-running command; its output is collected by a thread."""
        proc = subprocess.Popen(
            self.command(argv, binds, workdir, env), stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT, text=True, start_new_session=True,
        )  # fmt: skip
        return Process(" ".join(argv[:2]), proc).start()


@dataclass
class Process:
    """A process in a container and the tail of its output."""

    label: str
    proc: subprocess.Popen[str]
    output: list[str] = field(default_factory=list)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    def start(self) -> Process:
        threading.Thread(target=self._read, daemon=True, name=f"out-{self.label}").start()
        return self

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            with self._lock:
                self.output.append(line.rstrip())
                del self.output[:-400]

    def tail(self, lines: int = 30) -> str:
        with self._lock:
            return "\n".join(self.output[-lines:])

    def wait_for(self, pattern: str, timeout: float) -> re.Match[str]:
        """The first output line matching `pattern`; raises if the process dies or times out."""
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                for line in self.output:
                    if m := regex.search(line):
                        return m
            if self.proc.poll() is not None:
                time.sleep(0.2)  # let the reader drain
                raise RuntimeError(f"{self.label} exited ({self.proc.returncode}):\n{self.tail()}")
            time.sleep(0.1)
        raise RuntimeError(f"{self.label}: no {pattern!r} within {timeout}s:\n{self.tail()}")

    def stop(self, grace: float = 15.0) -> int | None:
        """SIGTERM, then SIGKILL after `grace` seconds; the exit status."""
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGTERM)
            try:
                self.proc.wait(grace)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(grace)
        return self.proc.returncode
