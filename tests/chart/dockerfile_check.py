"""Static rules for the repository's Dockerfile (also built for real by `make image`).

Parses the Dockerfile into instructions (continuation lines joined, comments dropped) and
checks what hadolint does not: the build is multi-stage with two targets, `control-plane`
and `agent` (the last stage, what a plain `docker build` makes); each target copies its venv
from a builder stage, runs as the non-root uid 10001 and has an entrypoint; the control
plane's builder installs the pinned requirements and the project with `--no-deps` and never
torch; every base image is pinned to a patch release (or a digest) and never `latest`; the
CUDA build argument is declared and documented. Called by tests/chart/test_dockerfile.py
and `python -m tests.chart.chart_check`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
UID = "10001"
TARGETS = ("control-plane", "agent")
# python:3.11.11-slim-bookworm, nvcr.io/nvidia/cuda:12.4.1-runtime-ubuntu22.04, or a digest.
_DIGEST = r"@sha256:[0-9a-f]{64}"
_PINNED = re.compile(rf"^[^:@\s]+(:\S*\d+\.\d+\.\d+\S*|{_DIGEST}|:\S+{_DIGEST})$")


@dataclass(frozen=True)
class Instruction:
    line: int  # 1-based line where the instruction starts
    keyword: str  # upper case: FROM, RUN, ...
    args: str


def parse(text: str) -> list[Instruction]:
    """Instructions in order; backslash continuations joined, comment lines skipped."""
    out: list[Instruction] = []
    buf, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue  # a comment inside a continued instruction
        if not buf:
            start = number
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        keyword, _, args = buf.partition(" ")
        out.append(Instruction(start, keyword.upper(), args.strip()))
        buf = ""
    return out


def _arg_defaults(instructions: list[Instruction]) -> dict[str, str]:
    """Defaults of the ARGs declared before the first FROM (the ones FROM can use)."""
    out = {}
    for ins in instructions:
        if ins.keyword == "FROM":
            break
        if ins.keyword == "ARG" and "=" in ins.args:
            name, _, value = ins.args.partition("=")
            out[name.strip()] = value.strip()
    return out


def stages(instructions: list[Instruction]) -> dict[str, list[Instruction]]:
    """Instructions of each stage from its FROM on, by stage name (or index when unnamed)."""
    out: dict[str, list[Instruction]] = {}
    current: list[Instruction] | None = None
    for ins in instructions:
        if ins.keyword == "FROM":
            words = ins.args.split()
            named = len(words) >= 3 and words[1].upper() == "AS"
            current = out.setdefault(words[2] if named else str(len(out)), [])
        if current is not None:
            current.append(ins)
    return out


def _copies_from(stage: list[Instruction]) -> list[str]:
    """Stages a stage copies from (`COPY --from=NAME`)."""
    return [m.group(1) for i in stage if (m := re.search(r"--from=(\S+)", i.args))]


def _target_problems(name: str, stage: list[Instruction], all_stages: dict[str, Any]) -> list[str]:
    found = []
    users = [i for i in stage if i.keyword == "USER"]
    if not users:
        found.append(f"target {name} has no USER: it would run as root")
    elif users[-1].args.split(":")[0] not in (UID, "tessera"):
        found.append(f"target {name} runs as {users[-1].args!r}, expected uid {UID}")
    venv = [i for i in stage if i.keyword == "COPY" and "/opt/tessera" in i.args]
    if not any(_copies_from([i]) and _copies_from([i])[0] in all_stages for i in venv):
        found.append(f"target {name} does not COPY --from=<builder> its venv (/opt/tessera)")
    if not any(i.keyword in ("ENTRYPOINT", "CMD") for i in stage):
        found.append(f"target {name} has no ENTRYPOINT/CMD")
    return found


def _control_plane_builder_problems(all_stages: dict[str, list[Instruction]]) -> list[str]:
    sources = [s for s in _copies_from(all_stages.get("control-plane", [])) if s in all_stages]
    runs = " ".join(i.args for s in sources for i in all_stages[s] if i.keyword == "RUN")
    found = []
    if "torch" in runs.replace("'torch'", "") or "TORCH_INDEX_URL" in runs:
        found.append("the control-plane builder installs torch")
    if "--no-deps" not in runs or "control-plane.lock" not in runs:
        found.append(
            "the control-plane builder must install requirements/control-plane.lock and "
            "the project with --no-deps"
        )
    if "--require-hashes" not in runs:
        found.append("the control-plane builder must install its lock with --require-hashes")
    return found


def problems(text: str) -> list[str]:
    """Every rule the Dockerfile text breaks (empty when it passes)."""
    instructions = parse(text)
    found: list[str] = []
    args = _arg_defaults(instructions)
    froms = [i for i in instructions if i.keyword == "FROM"]
    if len(froms) < 2:
        found.append("not multi-stage: expected builder and runtime stages")
    stage_names = set()
    for ins in froms:
        words = ins.args.split()
        image = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), words[0])
        if len(words) >= 3 and words[1].upper() == "AS":
            stage_names.add(words[2])
        if image in stage_names:
            continue
        untagged = ":" not in image.split("/")[-1] and "@" not in image
        if image.endswith(":latest") or untagged:
            found.append(f"line {ins.line}: base image {image!r} is unpinned or latest")
        elif not _PINNED.match(image):
            found.append(f"line {ins.line}: base image {image!r} is not pinned to a patch release")
    all_stages = stages(instructions)
    for name in TARGETS:
        if name not in all_stages:
            found.append(f"no stage named {name} (a build target)")
        else:
            found.extend(_target_problems(name, all_stages[name], all_stages))
    if all_stages and list(all_stages)[-1] != "agent":
        found.append("the last stage (a plain `docker build`) is not the agent")
    if "control-plane" in all_stages:
        found.extend(_control_plane_builder_problems(all_stages))
    if not any(i.keyword == "ARG" and i.args.startswith("TORCH_VARIANT") for i in instructions):
        found.append("no ARG TORCH_VARIANT (the CUDA torch build argument)")
    if "TORCH_VARIANT" not in "".join(ln for ln in text.splitlines() if ln.startswith("#")):
        found.append("TORCH_VARIANT is not explained in a comment")
    if any(i.keyword == "ADD" and re.match(r"https?://", i.args) for i in instructions):
        found.append("ADD of a URL: fetch with a checksum in RUN instead")
    return found


def check(path: Path = DOCKERFILE) -> list[str]:
    return problems(path.read_text())
