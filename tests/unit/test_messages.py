"""What a client refuses before sending a message (turnkeeper.client): text or an
id that no payload can carry (a lone surrogate, which JSON can escape), and an
id that PostgreSQL cannot keep (NUL), each named in words. NUL inside the text
is fine: the stores keep the text as JSON (tests/store/test_store.py)."""

from __future__ import annotations

import pytest

from turnkeeper import client as tk
from turnkeeper.config import Settings

SETTINGS = Settings()


@pytest.mark.parametrize(
    ("text", "message_id", "words"),
    [
        ("hi \ud800", None, "the text is not valid Unicode (a lone surrogate at character 4)"),
        ("hi", "a\udfffb", "the message id is not valid Unicode (a lone surrogate at character 2)"),
        ("hi", "a\x00b", "the message id holds a NUL character"),
        ("hi", "", "a message id is 1-200 characters, got 0"),
        ("hi", "m" * 201, "a message id is 1-200 characters, got 201"),
    ],
)
def test_refused_in_words(text: str, message_id: str | None, words: str) -> None:
    with pytest.raises(tk.MalformedMessage, match=words.replace("(", r"\(").replace(")", r"\)")):
        tk.new_message(text, SETTINGS, message_id=message_id)


@pytest.mark.parametrize(
    ("text", "message_id"), [("nul \x00 inside", "m-1"), ("é ✓ 😀", "é" * 200), ("\x07", None)]
)
def test_taken(text: str, message_id: str | None) -> None:
    message = tk.new_message(text, SETTINGS, message_id=message_id)
    assert message.text == text and (message_id is None or message.message_id == message_id)


def test_the_message_ids_checked_before_sending_are_those_the_model_takes() -> None:
    from pydantic import ValidationError

    from turnkeeper.models import UserMessage

    for length in (0, 1, 200, 201):
        checked = length in tk.MESSAGE_ID_LENGTHS
        try:
            UserMessage(message_id="m" * length, text="")
        except ValidationError:
            assert not checked
        else:
            assert checked
