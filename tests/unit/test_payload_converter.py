"""The shared payload converter: one instance per process behind every data converter
of ours, converting as pydantic's does."""

from __future__ import annotations

import dataclasses
import os

import pytest
from temporalio.contrib.pydantic import pydantic_data_converter
from temporalio.converter import WorkflowSerializationContext

from turnkeeper.config_values import EncryptionKey
from turnkeeper.models import ChatTurnInput, TurnState, TurnStatus, UserMessage
from turnkeeper.payloads.converter import SharedPayloadConverter
from turnkeeper.payloads.encryption import data_converter


def _inner(converter: object) -> object:
    # The SDK wraps every payload converter in its transfer-type converter.
    return getattr(converter, "_inner_payload_converter", converter)


@pytest.mark.parametrize("keys", [(), (EncryptionKey("k1", os.urandom(32)),)], ids=["plain", "encrypted"])
def test_every_data_converter_the_sdk_builds_from_ours_shares_one_payload_converter(keys) -> None:
    converter = data_converter(keys)
    # What the SDK does for each workflow activation: a fresh data converter.
    rebuilt = dataclasses.replace(converter)
    assert (
        _inner(rebuilt.payload_converter) is _inner(converter.payload_converter) is SharedPayloadConverter()
    )
    context = WorkflowSerializationContext(namespace="default", workflow_id="chat-a")
    assert _inner(converter.with_context(context).payload_converter) is SharedPayloadConverter()


def test_it_converts_as_pydantics_converter_does() -> None:
    values = [
        ChatTurnInput(chat_id="a", pending=[UserMessage(message_id="m1", text="hi")]),
        TurnState(chat_id="a", turn=3, status=TurnStatus.AWAITING_USER),
        {"plain": [1, 2]},
        None,
    ]
    ours = data_converter(()).payload_converter.to_payloads(values)
    assert ours == pydantic_data_converter.payload_converter.to_payloads(values)
    hints = [ChatTurnInput, TurnState, dict, type(None)]
    assert data_converter(()).payload_converter.from_payloads(ours, hints) == values


def test_it_takes_no_options() -> None:
    with pytest.raises(TypeError, match="takes no options"):
        SharedPayloadConverter(max_cached_type_adapters=1)  # type: ignore[call-arg]
