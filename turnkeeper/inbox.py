"""A run's inbox: messages it acknowledged and has not committed yet, in order.

Bounded so that nothing a user sends can add up to a workflow task Temporal
refuses (2 MB per payload): the pending bytes of a chat are capped, and messages
travel to the store in chunks well under the limit. Pure: the turn workflow keeps
one; the reconciler cuts a failed turn's messages into the same chunks.
"""

from __future__ import annotations

from collections.abc import Collection

from turnkeeper.models import UserMessage

# One store write carries at most this much message data (one larger message alone).
CHUNK_BYTES = 256 * 1024


def wire_size(message: UserMessage) -> int:
    """Bytes the message takes in a payload: JSON escaping can make it far larger
    than its text (a control character becomes six bytes)."""
    return len(message.model_dump_json().encode())


def chunks(messages: list[UserMessage], limit: int = CHUNK_BYTES) -> list[list[UserMessage]]:
    """`messages` in order, cut into runs of at most `limit` bytes (a larger
    message is a chunk of its own)."""
    out: list[list[UserMessage]] = []
    size = 0
    for message in messages:
        n = wire_size(message)
        if not out or size + n > limit:
            out.append([])
            size = 0
        out[-1].append(message)
        size += n
    return out


def too_large(message: UserMessage, max_bytes: int) -> str:
    return f"message is {len(message.text.encode())} bytes; the limit is {max_bytes}"


class Inbox:
    def __init__(self) -> None:
        self._waiting: list[UserMessage] = []
        self._in_flight: list[UserMessage] = []
        self._seen: set[str] = set()
        self._sizes: dict[str, int] = {}
        self._bytes = 0  # of waiting + in flight, kept as they change: signals ask for it

    def _size(self, messages: list[UserMessage]) -> int:
        return sum(self._sizes.get(m.message_id, 0) for m in messages)

    @property
    def waiting(self) -> list[UserMessage]:
        """Taken, not yet handed to a model call."""
        return self._waiting

    @waiting.setter
    def waiting(self, messages: list[UserMessage]) -> None:
        self._bytes += self._size(messages) - self._size(self._waiting)
        self._waiting = messages

    @property
    def in_flight(self) -> list[UserMessage]:
        """Handed to a model call not yet finished: a lost call may not have committed them."""
        return self._in_flight

    @in_flight.setter
    def in_flight(self, messages: list[UserMessage]) -> None:
        self._bytes += self._size(messages) - self._size(self._in_flight)
        self._in_flight = messages

    def offer(self, message: UserMessage) -> bool:
        """Take a message; False for a client's retry of one already taken."""
        if message.message_id in self._seen:
            return False
        self._seen.add(message.message_id)
        self._sizes[message.message_id] = size = wire_size(message)
        self._waiting.append(message)
        self._bytes += size
        return True

    def refusal(self, message: UserMessage, max_bytes: int, max_pending: int) -> str | None:
        """Why `message` is refused, if it is: too large, or past the bytes the chat may
        hold unanswered (a client's retry of a message taken already is not)."""
        if len(message.text.encode()) > max_bytes:
            return too_large(message, max_bytes)
        if self.seen(message.message_id) or self._bytes + wire_size(message) <= max_pending:
            return None
        return (
            f"the chat already holds {self._bytes} bytes of messages not yet answered and this one "
            f"would pass the limit of {max_pending}; send it again once the turn has answered"
        )

    def seen(self, message_id: str) -> bool:
        return message_id in self._seen

    def pending_bytes(self) -> int:
        return self._bytes

    def ids(self) -> list[str]:
        return [m.message_id for m in self._in_flight + self._waiting]

    def take(self) -> list[UserMessage]:
        batch = self._waiting
        self.waiting = []
        return batch

    def drop(self, message_ids: set[str]) -> None:
        self.waiting = [m for m in self._waiting if m.message_id not in message_ids]

    def pull(self, message_ids: Collection[str | None]) -> list[UserMessage]:
        """The waiting messages among `message_ids`, in order, taken out of the inbox."""
        pulled = [m for m in self._waiting if m.message_id in message_ids]
        self.waiting = [m for m in self._waiting if m.message_id not in message_ids]
        return pulled

    def return_in_flight(self) -> None:
        """A call that did not finish: its messages go back, first, in order."""
        self.waiting = self._in_flight + self._waiting
        self.in_flight = []
