"""Reading a command's input files (YAML manifests, JSON documents) with errors that name
the flag: `read_yaml` / `read_json` raise `fields.FieldError(what, ...)` for an unreadable
file or bad syntax, which the command prints as its error. Called by `tessera plan` and
`tessera sim`.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import yaml

from tessera import fields


def read_yaml(path: str, what: str) -> Any:
    """The YAML document in `path`; `what` names the flag that gave it."""
    return _read(path, what, yaml.safe_load, "YAML", yaml.YAMLError)


def read_json(path: str, what: str) -> Any:
    """The JSON document in `path`; `what` names the flag that gave it."""
    return _read(path, what, json.loads, "JSON", json.JSONDecodeError)


def _read(path: str, what: str, load: Callable[[str], Any], kind: str, bad: type[Exception]) -> Any:
    try:
        return load(Path(path).read_text())
    except OSError as exc:
        raise fields.FieldError(what, f"cannot read {path}: {exc.strerror}") from None
    except bad as exc:
        raise fields.FieldError(what, f"{path} is not valid {kind}: {exc}") from None
