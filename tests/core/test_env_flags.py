"""`tessera.env_flags`: one parse of on/off switches for every entry point."""

from __future__ import annotations

import pytest

from tessera import env_flags

NAME = "TESSERA_TEST_FLAG"


def test_on_is_off_only_for_an_off_word() -> None:
    assert env_flags.on({}, NAME)
    for word in ("0", "false", " No ", "OFF"):
        assert not env_flags.on({NAME: word}, NAME)
    assert env_flags.on({NAME: "whatever"}, NAME)


def test_strict_takes_on_and_off_words_and_refuses_the_rest() -> None:
    assert env_flags.strict({}, NAME, True) and not env_flags.strict({}, NAME, False)
    assert env_flags.strict({NAME: "On"}, NAME, False)
    assert not env_flags.strict({NAME: "0"}, NAME, True)
    with pytest.raises(ValueError, match=NAME):
        env_flags.strict({NAME: "maybe"}, NAME, True)
