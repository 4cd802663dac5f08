"""Payload encryption (TURNKEEPER_ENCRYPTION_KEYS): an AES-256-GCM payload codec
and the data converter every client of ours uses (`data_converter`).

An encrypted payload is the original payload, serialized and sealed:

    metadata  encoding: binary/encrypted, encryption-key-id: <key id>
    data      12-byte nonce || AES-256-GCM(serialized payload, aad=ENCODING:key id)

The first configured key encrypts; every configured key decrypts, so a new key
can be put first while payloads under the old one are still read. Without keys
payloads stay plain JSON, and an encrypted one is refused in words instead of
being read as an unknown encoding.

`cryptography` is imported only when keys are set: the CLI's commands stay light.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING

from temporalio.api.common.v1 import Payload
from temporalio.api.failure.v1 import Failure
from temporalio.converter import (
    DataConverter,
    DefaultFailureConverter,
    DefaultFailureConverterWithEncodedAttributes,
    PayloadCodec,
    PayloadConverter,
)

from turnkeeper.config_values import EncryptionKey

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.ciphers.aead import AESGCM

ENCODING = b"binary/encrypted"
KEY_ID_METADATA = "encryption-key-id"
NONCE_BYTES = 12
TAG_BYTES = 16
KEYS_VAR = "TURNKEEPER_ENCRYPTION_KEYS"


# Every DecryptionError's message starts so: a query's failure reaches a client as
# its message alone, and this is how the CLI and the web process recognise it.
CANNOT_DECRYPT = "cannot decrypt a payload"


class DecryptionError(ValueError):
    """A payload that cannot be decrypted here. The message names the key id and
    never any content. A ValueError, not a RuntimeError: in a worker, a workflow
    task that meets one fails and is retried (until a worker holds the key), it
    does not fail the run."""

    def __init__(self, why: str) -> None:
        super().__init__(f"{CANNOT_DECRYPT}: {why}")


def names_decryption_error(message: str | None) -> bool:
    return message is not None and CANNOT_DECRYPT in message


def key_id_of(payload: Payload) -> str | None:
    """The key id of an encrypted payload; None for a plain one."""
    if payload.metadata.get("encoding") != ENCODING:
        return None
    return payload.metadata.get(KEY_ID_METADATA, b"").decode(errors="replace")


def _aad(key_id: str) -> bytes:
    return ENCODING + b":" + key_id.encode()


class EncryptionCodec(PayloadCodec):
    """AES-256-GCM under the first key; decrypts under any listed key; plain
    payloads (written before encryption was turned on) pass through."""

    def __init__(self, keys: Sequence[EncryptionKey]) -> None:
        if not keys:
            raise ValueError("EncryptionCodec needs at least one key")
        from cryptography.hazmat.primitives.ciphers.aead import AESGCM

        self.key_id = keys[0].key_id
        self._ciphers: dict[str, AESGCM] = {k.key_id: AESGCM(k.secret) for k in keys}
        self._metadata = {"encoding": ENCODING, KEY_ID_METADATA: self.key_id.encode()}
        self._encrypting = self._ciphers[self.key_id]

    @property
    def key_ids(self) -> tuple[str, ...]:
        return tuple(self._ciphers)

    def encrypt(self, payload: Payload) -> Payload:
        nonce = os.urandom(NONCE_BYTES)  # random per payload: 2^32 payloads per key stay far from a collision
        sealed = self._encrypting.encrypt(nonce, payload.SerializeToString(), _aad(self.key_id))
        return Payload(metadata=self._metadata, data=nonce + sealed)

    def decrypt(self, payload: Payload) -> Payload:
        key_id = key_id_of(payload)
        if key_id is None:
            return payload
        cipher = self._ciphers.get(key_id)
        if cipher is None:
            raise DecryptionError(
                f"it is encrypted under key id {key_id!r}, which {KEYS_VAR} does not list "
                f"here (it lists {', '.join(map(repr, self._ciphers))}); add that key back "
                "to read it"
            )
        from cryptography.exceptions import InvalidTag

        data = payload.data
        if len(data) < NONCE_BYTES + TAG_BYTES:
            raise DecryptionError(f"the payload under key id {key_id!r} is too short: it was cut or altered")
        try:
            plain = cipher.decrypt(data[:NONCE_BYTES], data[NONCE_BYTES:], _aad(key_id))
        except InvalidTag:
            raise DecryptionError(
                f"the payload under key id {key_id!r} fails its integrity check: it was "
                "altered, or sealed with another key of that id"
            ) from None
        inner = Payload()
        inner.ParseFromString(plain)  # authenticated, so well-formed
        return inner

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self.encrypt(p) for p in payloads]

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self.decrypt(p) for p in payloads]


class PlaintextCodec(PayloadCodec):
    """No keys: payloads stay as they are. An encrypted one is refused in words
    (a worker then fails the task, to be retried where the keys are, instead of
    failing the run on an unknown encoding or refusing a user's message)."""

    key_id = None
    key_ids: tuple[str, ...] = ()

    def decrypt(self, payload: Payload) -> Payload:
        key_id = key_id_of(payload)
        if key_id is not None:
            raise DecryptionError(
                f"it is encrypted under key id {key_id!r}, but {KEYS_VAR} is unset here: "
                "set it as the workers have it"
            )
        return payload

    def encrypt(self, payload: Payload) -> Payload:
        return payload

    async def encode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return list(payloads)

    async def decode(self, payloads: Sequence[Payload]) -> list[Payload]:
        return [self.decrypt(p) for p in payloads]


class FailureConverter(DefaultFailureConverterWithEncodedAttributes):
    """Messages and stack traces travel encrypted, except a DecryptionError's own:
    it names a key id, no content, and a query that fails on it reaches the
    client as its message alone, which must say why to a reader without the key."""

    _plain = DefaultFailureConverter()

    def to_failure(
        self, exception: BaseException, payload_converter: PayloadConverter, failure: Failure
    ) -> None:
        if isinstance(exception, DecryptionError):
            self._plain.to_failure(exception, payload_converter, failure)
            failure.stack_trace = ""  # the SDK's decoding frames, at every retry of the task
        else:
            super().to_failure(exception, payload_converter, failure)


def payload_codec(keys: Sequence[EncryptionKey]) -> EncryptionCodec | PlaintextCodec:
    return EncryptionCodec(keys) if keys else PlaintextCodec()


def data_converter(keys: Sequence[EncryptionKey]) -> DataConverter:
    """The pydantic data converter, with payloads encrypted when there are keys.
    Failure messages and stack traces then travel as an encoded (so encrypted)
    attribute too; without keys they stay readable as before."""
    from turnkeeper.payloads.converter import SharedPayloadConverter

    if not keys:
        return DataConverter(payload_converter_class=SharedPayloadConverter, payload_codec=PlaintextCodec())
    return DataConverter(
        payload_converter_class=SharedPayloadConverter,
        payload_codec=EncryptionCodec(keys),
        failure_converter_class=FailureConverter,
    )
