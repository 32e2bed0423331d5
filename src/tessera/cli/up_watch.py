"""`tessera up` watches its manifest: a saved change is applied to the running deployment.

`run_loop` is `up_cmd._serve`'s loop once serving: every `--watch-interval` seconds it
polls `ManifestWatcher`, and it runs a converge pass (`converge_pass`, given by `up`)
at once after a change, then every `--watch-interval` while a transition is under way
(each pass does the steps that can be done now: level-triggered, like the operator),
and every `--reconcile-interval` otherwise (drift: a restarted agent gets its blocks).
`ManifestWatcher.poll()`
It notices a change of the file (mtime, size or inode, so an editor's atomic rename
counts), parses and validates it (`api.parse`), and returns the new `ServingDeployment`;
`up` then runs the transition to it through the operator's converge pass (the pure
transition planner and its executor), publishing each cut-over to the in-process gateway.
A manifest that does not parse, or that names another deployment or model, is reported
(`ManifestError`, once per change) and the running deployment keeps serving unchanged.
"""

from __future__ import annotations

import asyncio
import dataclasses
import os
import time
from collections.abc import Awaitable, Callable, Sequence
from pathlib import Path
from typing import Any

from tessera import api, fields
from tessera.cli import supervise


class ManifestError(Exception):
    """The changed manifest cannot be applied; the message says why."""


class ManifestWatcher:
    """Re-reads a ServingDeployment manifest when the file changes."""

    def __init__(
        self,
        path: Path,
        current: api.ServingDeployment,
        check: Callable[[api.ServingDeployment], list[str]] | None = None,
    ) -> None:
        self.path = path
        self.current = current
        self.check = check
        self._seen = self._stamp()

    def _stamp(self) -> tuple[int, int, int] | None:
        try:
            st = os.stat(self.path)
        except OSError:
            return None
        return (st.st_mtime_ns, st.st_size, st.st_ino)

    def poll(self) -> api.ServingDeployment | None:
        """The new deployment if the file changed into a different valid one, else None;
        ManifestError (once per change) when the change cannot be applied."""
        stamp = self._stamp()
        if stamp == self._seen:
            return None
        self._seen = stamp
        if stamp is None:
            raise ManifestError(f"{self.path}: cannot be read (keeping the running layout)")
        import yaml

        try:
            doc: Any = yaml.safe_load(self.path.read_text())
            dep = api.parse(doc)
        except OSError as exc:
            raise ManifestError(f"{self.path}: {exc}") from exc
        except (fields.FieldError, yaml.YAMLError) as exc:
            raise ManifestError(f"{self.path}: {exc} (keeping the running layout)") from exc
        old = self.current
        if (dep.namespace, dep.name) != (old.namespace, old.name):
            raise ManifestError(
                f"{self.path}: names {dep.namespace}/{dep.name}, but `tessera up` serves "
                f"{old.namespace}/{old.name} (restart it to serve another deployment)"
            )
        if dep.spec.model != old.spec.model:
            raise ManifestError(
                f"{self.path}: spec.model changed; `tessera up` serves one model "
                "(restart it to serve another)"
            )
        if dep.spec == old.spec:
            return None
        if self.check is not None:  # e.g. adapters that do not fit (cli/variant_check)
            bad = self.check(dep)
            if bad:
                raise ManifestError(f"{self.path}: {'; '.join(bad)} (keeping the running layout)")
        # like metadata.generation on a cluster: every applied change of the spec bumps it
        dep = dataclasses.replace(dep, generation=max(dep.generation, old.generation + 1))
        self.current = dep
        return dep


ConvergePass = Callable[[api.ServingDeployment], Awaitable[bool]]


async def run_loop(
    stop: asyncio.Event,
    watcher: ManifestWatcher,
    converge_pass: ConvergePass,
    report: Callable[[str], None],
    reconcile_interval_s: float,
    watch_interval_s: float,
    wake: Sequence[asyncio.Event] = (),
) -> None:
    """Until `stop`: apply manifest changes and re-converge (module docstring).
    `converge_pass(dep)` returns True while a transition is still under way. Any of
    `wake` (the agent supervisor's restart event: reload a restarted agent's blocks; the
    autoscaler's `resized`: plan its new replica count) forces a pass at once."""
    busy = False
    next_pass = time.monotonic() + reconcile_interval_s
    while not stop.is_set():
        wait = watch_interval_s
        if not busy:
            wait = min(wait, max(0.0, next_pass - time.monotonic()))
        await supervise.wait_any([stop, *wake], wait)
        if stop.is_set():
            return
        for w in wake:
            if w.is_set():
                w.clear()
                next_pass = time.monotonic()  # reload a restarted agent, or resize, now
        try:
            changed = watcher.poll()
        except ManifestError as exc:
            report(f"manifest not applied: {exc}")
            changed = None
        if changed is not None:
            report(f"manifest changed: applying generation {changed.generation}")
            busy = True
        if busy or time.monotonic() >= next_pass:
            try:
                busy = await converge_pass(watcher.current)
            except Exception as exc:  # the loop must survive anything; the next pass retries
                report(f"converge pass failed: {exc!r}")
            next_pass = time.monotonic() + reconcile_interval_s
