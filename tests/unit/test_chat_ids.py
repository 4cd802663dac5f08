"""One chat id rule for every way a chat begins (turnkeeper/chat_ids.py): `send`
refuses what the page's API refuses, as bad usage and before any request, and
so does `send_message`. An empty id used to start a run that failed at once
while `send` waited for it; an over-long one ended in the server's traceback."""

from __future__ import annotations

import re

import pytest
from hypothesis import given
from hypothesis import strategies as st

from turnkeeper import cli
from turnkeeper import client as tk
from turnkeeper.chat_ids import CHAT_ID_RULE, InvalidChatId, check_chat_id, valid_chat_id
from turnkeeper.config import Settings

ALLOWED = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789._:-"


@pytest.mark.parametrize("chat_id", ["demo", "a", "x" * 128, "team.a:b_c-1", "9"])
def test_ids_of_the_rule_pass(chat_id: str) -> None:
    assert check_chat_id(chat_id) == chat_id


@pytest.mark.parametrize(
    "chat_id", ["", " ", "a b", "../x", "a/b", "é", "x" * 129, "tab\t", "new\nline", "chat\x00"]
)
def test_others_are_refused_with_the_rule(chat_id: str) -> None:
    with pytest.raises(InvalidChatId, match=re.escape(CHAT_ID_RULE)):
        check_chat_id(chat_id)


@given(st.text(max_size=140))
def test_the_rule_is_what_it_says(chat_id: str) -> None:
    assert valid_chat_id(chat_id) == (1 <= len(chat_id) <= 128 and set(chat_id) <= set(ALLOWED))


def test_the_workflow_id_stays_under_temporals_limit() -> None:
    assert len(tk.workflow_id("x" * 128).encode()) < 1000


@pytest.mark.parametrize("chat_id", ["", "a b", "x" * 1200])
def test_send_refuses_it_as_bad_usage_before_sending(
    chat_id: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exit_:
        cli.run(["send", chat_id, "hello"])  # no server is asked: argparse refuses first
    assert exit_.value.code == cli.EXIT_USAGE
    err = capsys.readouterr().err
    assert CHAT_ID_RULE in err and "Traceback" not in err


async def test_send_message_refuses_it_before_any_request() -> None:
    class NoClient:
        def __getattr__(self, name: str) -> object:
            raise AssertionError(f"the client was used ({name})")

    settings = Settings()
    with pytest.raises(InvalidChatId):
        await tk.send_message(NoClient(), settings, "", tk.new_message("hello", settings))  # type: ignore[arg-type]
