"""`tessera up` watches its manifest: a saved change is applied to the running deployment.

`ManifestWatcher.poll()` is called by `up_cmd._serve` every `--watch-interval` seconds.
It notices a change of the file (mtime, size or inode, so an editor's atomic rename
counts), parses and validates it (`api.parse`), and returns the new `ServingDeployment`;
`up` then runs the transition to it through the operator's converge pass (the pure
transition planner and its executor), publishing each cut-over to the in-process gateway.
A manifest that does not parse, or that names another deployment or model, is reported
(`ManifestError`, once per change) and the running deployment keeps serving unchanged.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from tessera import api, fields


class ManifestError(Exception):
    """The changed manifest cannot be applied; the message says why."""


class ManifestWatcher:
    """Re-reads a ServingDeployment manifest when the file changes."""

    def __init__(self, path: Path, current: api.ServingDeployment) -> None:
        self.path = path
        self.current = current
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
        # like metadata.generation on a cluster: every applied change of the spec bumps it
        dep = dataclasses.replace(dep, generation=max(dep.generation, old.generation + 1))
        self.current = dep
        return dep
