"""`tessera.env_flags`: one parse of on/off switches for every module."""

from __future__ import annotations

import pytest

from tessera import env_flags

NAME = "TESSERA_TEST_FLAG"


def test_on_is_off_only_for_an_off_word(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(NAME, raising=False)
    assert env_flags.on(NAME)
    for word in ("0", "false", " No ", "OFF"):
        monkeypatch.setenv(NAME, word)
        assert not env_flags.on(NAME)
    monkeypatch.setenv(NAME, "whatever")
    assert env_flags.on(NAME)


def test_strict_takes_on_and_off_words_and_refuses_the_rest(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.delenv(NAME, raising=False)
    assert env_flags.strict(NAME, True) and not env_flags.strict(NAME, False)
    monkeypatch.setenv(NAME, "On")
    assert env_flags.strict(NAME, False)
    monkeypatch.setenv(NAME, "0")
    assert not env_flags.strict(NAME, True)
    monkeypatch.setenv(NAME, "maybe")
    with pytest.raises(ValueError, match=NAME):
        env_flags.strict(NAME, True)
