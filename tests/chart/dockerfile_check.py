"""Static rules for the repository's Dockerfile (no Docker engine runs in CI or here).

Parses the Dockerfile into instructions (continuation lines joined, comments dropped) and
checks what hadolint does not: the build is multi-stage, the runtime stage copies the venv
from the builder and runs as the non-root uid 10001, every base image is pinned to a
patch release (or a digest) and never `latest`, and the CUDA build argument is declared and
documented. Called by tests/chart/test_dockerfile.py and `python -m tests.chart.chart_check`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DOCKERFILE = ROOT / "Dockerfile"
UID = "10001"
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


def problems(text: str) -> list[str]:
    """Every rule the Dockerfile text breaks (empty when it passes)."""
    instructions = parse(text)
    found: list[str] = []
    args = _arg_defaults(instructions)
    stages = [i for i in instructions if i.keyword == "FROM"]
    if len(stages) < 2:
        found.append("not multi-stage: expected a builder and a runtime stage")
    stage_names = set()
    for ins in stages:
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
    # Rules about the final (runtime) stage.
    last_from = max((i.line for i in stages), default=0)
    runtime = [i for i in instructions if i.line >= last_from]
    users = [i for i in runtime if i.keyword == "USER"]
    if not users:
        found.append("runtime stage has no USER: it would run as root")
    elif users[-1].args.split(":")[0] not in (UID, "tessera"):
        found.append(f"runtime stage runs as {users[-1].args!r}, expected uid {UID}")
    if not any(i.keyword == "COPY" and "--from=builder" in i.args for i in runtime):
        found.append("runtime stage does not COPY --from=builder (the venv)")
    if not any(i.keyword in ("ENTRYPOINT", "CMD") for i in runtime):
        found.append("runtime stage has no ENTRYPOINT/CMD")
    if not any(i.keyword == "ARG" and i.args.startswith("TORCH_VARIANT") for i in instructions):
        found.append("no ARG TORCH_VARIANT (the CUDA torch build argument)")
    if "TORCH_VARIANT" not in "".join(ln for ln in text.splitlines() if ln.startswith("#")):
        found.append("TORCH_VARIANT is not explained in a comment")
    if any(i.keyword == "ADD" and re.match(r"https?://", i.args) for i in instructions):
        found.append("ADD of a URL: fetch with a checksum in RUN instead")
    return found


def check(path: Path = DOCKERFILE) -> list[str]:
    return problems(path.read_text())
