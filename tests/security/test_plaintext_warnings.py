"""Without TLS, the operator, a gateway and `tessera up --agent` say what an open agent port
gives away (issue 31); with TLS files (built from `TESSERA_TLS_DIR`) they say nothing."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from tessera.rpc import transport


def test_warn_if_plaintext(caplog: pytest.LogCaptureFixture) -> None:
    log = logging.getLogger("tessera.test")
    with caplog.at_level(logging.WARNING):
        assert transport.warn_if_plaintext(log, None)
    assert "plaintext" in caplog.text and "read every deployment's weights" in caplog.text
    caplog.clear()
    files = transport.TlsFiles(Path("ca.crt"), Path("tls.crt"), Path("tls.key"))
    with caplog.at_level(logging.WARNING):
        assert not transport.warn_if_plaintext(log, files)
    assert caplog.text == ""


def test_operator_and_gateway_warn_at_start() -> None:
    """Both entry points call the warning (read from their source: starting them needs a
    cluster or agents)."""
    cli = Path(__file__).parents[2] / "src/tessera/cli"
    for name in ("operator_cmd.py", "gateway_cmd.py"):
        assert "transport.warn_if_plaintext(" in (cli / name).read_text(), name
    assert "PLAINTEXT_WARNING" in (cli / "up_cmd.py").read_text()
