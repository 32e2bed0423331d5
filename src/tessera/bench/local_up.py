"""A tiny checkpoint and a `tessera up` process for a benchmark to drive.

`make_tiny` writes the default tiny checkpoint (or a wider one) with `tessera model
make-tiny`; `write_yaml` replaces a manifest atomically, as an editor's save would (the
`up` watcher reads it); `Up` starts `tessera up -f MANIFEST --port 0 ...` in its own
process group, waits for its "serving at URL" line, keeps reading its output (so it
never blocks on a full pipe; the lines are kept in `log`) and stops the whole group on
exit. Called by the serving benchmarks (`tessera.cli.bench_*`,
`tessera_agent.bench_gpu_serve`).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from types import TracebackType
from typing import Any

EXE = [sys.executable, "-m", "tessera.cli.main"]
URL_RE = re.compile(r"at (http://\S+)")


def make_tiny(path: Path, *flags: str) -> Path:
    """`tessera model make-tiny PATH FLAGS...`; returns the path."""
    subprocess.run(
        [*EXE, "model", "make-tiny", str(path), *flags], check=True, stdout=subprocess.DEVNULL
    )
    return path


def write_yaml(path: Path, doc: dict[str, Any]) -> None:
    """Replace `path` with `doc` as YAML, atomically."""
    import yaml

    tmp = path.with_suffix(".tmp")
    tmp.write_text(yaml.safe_dump(doc, sort_keys=False))
    os.replace(tmp, path)


class UpFailed(RuntimeError):
    """`tessera up` exited before serving (its output is in the message)."""


class Up:
    """`tessera up -f manifest --port 0 --state-file STATE FLAGS...` while in a `with`;
    `env` is added to this process's environment for it (and the agents it starts)."""

    def __init__(
        self, manifest: Path, *flags: str, env: dict[str, str] | None = None, what: str = "bench"
    ) -> None:
        self.manifest, self.flags, self.env, self.what = manifest, flags, env, what
        self.state = manifest.with_name(manifest.stem + "-state.json")
        self.log: list[str] = []
        self.url = ""
        self.ready_s = 0.0  # start to the "serving" line
        self.proc: subprocess.Popen[str] | None = None

    def __enter__(self) -> Up:
        cmd = [*EXE, "up", "-f", str(self.manifest), "--port", "0", "--state-file", str(self.state)]
        t0 = time.perf_counter()
        self.proc = subprocess.Popen(
            [*cmd, *self.flags],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
            env={**os.environ, **self.env} if self.env else None,
        )
        try:
            self.url = self._wait_for_url()
        except BaseException:
            self._stop()
            raise
        self.ready_s = time.perf_counter() - t0
        return self

    def _wait_for_url(self) -> str:
        assert self.proc is not None and self.proc.stdout is not None
        out = self.proc.stdout
        for line in out:
            self.log.append(line.rstrip())
            m = URL_RE.search(line)
            if m and "serving" in line:
                threading.Thread(
                    target=lambda: self.log.extend(x.rstrip() for x in out), daemon=True
                ).start()
                return m.group(1)
        raise UpFailed(f"tessera bench {self.what}: `tessera up` failed:\n" + "\n".join(self.log))

    def agents(self) -> list[str]:
        """The local agents' addresses, from `up`'s state file."""
        return [a["address"] for a in json.loads(self.state.read_text())["agents"]]

    def _stop(self) -> None:
        if self.proc is None:
            return
        os.killpg(self.proc.pid, signal.SIGTERM)
        try:
            self.proc.wait(30)
        except subprocess.TimeoutExpired:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(30)

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop()
