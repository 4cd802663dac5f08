"""What a chat id may be: 1-128 characters of A-Z a-z 0-9 . _ : -

One rule for every way in (`send`, `send_message`, the page's API), so a chat
one of them starts is one the others can reach. It also keeps the workflow id
`chat-<chat_id>` far under Temporal's 1,000-byte limit, and an empty or blank
id, which `ChatTurn` refuses by failing its run, never reaches a workflow.
Plain Python: the CLI checks it before loading anything else.
"""

from __future__ import annotations

import re

CHAT_ID_RULE = "a chat id is 1-128 characters of A-Z a-z 0-9 . _ : -"
_CHAT_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


class InvalidChatId(ValueError):
    pass


def valid_chat_id(chat_id: str) -> bool:
    return _CHAT_ID.fullmatch(chat_id) is not None


def check_chat_id(chat_id: str) -> str:
    """`chat_id` itself, or `InvalidChatId` naming the rule."""
    if not valid_chat_id(chat_id):
        shown = chat_id if len(chat_id) <= 40 else chat_id[:40] + "..."
        raise InvalidChatId(f"chat id {shown!r}: {CHAT_ID_RULE}")
    return chat_id
