"""The /api handlers: the same calls the CLI makes, answered in HTTP."""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any

from starlette.requests import Request
from starlette.responses import JSONResponse, Response

from turnkeeper import client as tk
from turnkeeper.failed_turns import state_of as _state_of
from turnkeeper.models import TurnState, TurnStatus
from turnkeeper.web.backends import ApiError, backends, chat_id_of, read_json

if TYPE_CHECKING:
    from temporalio.client import WorkflowHandle

    from turnkeeper.recovery import Action

# A worker answers in milliseconds; without one the server would hold the call.
WORKER_TIMEOUT = timedelta(seconds=10)
MAX_ID_CHARS = 200  # as the workflow's own models allow
CHAT_LIST_LIMIT = 500


def _short_id(body: dict[str, Any], key: str, required: bool) -> str | None:
    value = body.get(key)
    if value is None and not required:
        return None
    if not isinstance(value, str) or not 0 < len(value) <= MAX_ID_CHARS:
        raise ApiError(422, f"{key!r} must be a string of 1-{MAX_ID_CHARS} characters")
    try:
        value.encode()
    except UnicodeEncodeError:  # JSON can escape a lone surrogate ("\ud800"); no payload carries one
        raise ApiError(422, f"{key!r} is not valid Unicode (a lone surrogate)") from None
    return value


async def _described(handle: WorkflowHandle[Any, Any], chat_id: str) -> Any:
    from temporalio.service import RPCError, RPCStatusCode

    try:
        return await handle.describe()
    except RPCError as err:
        if err.status == RPCStatusCode.NOT_FOUND:
            raise ApiError(404, f"no chat {chat_id!r}: nothing was ever sent to it") from None
        raise


async def list_chats(request: Request) -> Response:
    store = await backends(request).store()
    return JSONResponse(
        [
            {
                "chat_id": r.chat_id,
                "turn": r.turn,
                "status": r.status.value,
                "reason": r.reason.value if r.reason else None,
                "updated_at": r.updated_at.isoformat(),
            }
            for r in await store.list_chats(limit=CHAT_LIST_LIMIT)
        ]
    )


async def send_message(request: Request) -> Response:
    chat_id = chat_id_of(request)
    settings = backends(request).settings
    # JSON may escape a byte as six (\u00XX): room for the largest message, escaped.
    body = await read_json(request, limit=settings.max_message_bytes * 6 + 1024)
    text = body.get("text")
    if not isinstance(text, str) or not text.strip():
        raise ApiError(422, "'text' must be a non-empty string")
    message_id = _short_id(body, "message_id", required=False)
    try:
        message = tk.new_message(text, settings, message_id=message_id)
    except tk.MessageTooLarge as err:
        raise ApiError(413, str(err)) from None
    except tk.MalformedMessage as err:
        raise ApiError(422, str(err)) from None
    # Durable once it returns; the workflow keeps one message per id.
    b = backends(request)
    try:
        await tk.send_message(await b.client(), settings, chat_id, message, eager=b.eager)
    except tk.TurnTakesNoMoreMessages as err:
        raise ApiError(429, str(err)) from None
    return JSONResponse({"message_id": message.message_id}, status_code=202)


async def get_state(request: Request) -> Response:
    from temporalio.client import WorkflowExecutionStatus
    from temporalio.service import RPCError, RPCStatusCode

    chat_id = chat_id_of(request)
    store = await backends(request).store()
    client = await backends(request).client()
    handle = client.get_workflow_handle(tk.workflow_id(chat_id))
    try:
        desc = await _described(handle, chat_id)
    except ApiError:
        record = await store.get_turn(chat_id)  # its runs may be past the server's retention
        if record is None:
            raise
        return JSONResponse(_state_of(record).model_dump(mode="json"))
    try:
        # Asked again once refused as a catch-up (turnkeeper/worker/catch_up.py).
        state = await tk.query_state(client, chat_id, rpc_timeout=WORKER_TIMEOUT)
    except RPCError as err:
        # No worker answers: the store's record of the turn is what is known.
        if err.status not in (
            RPCStatusCode.FAILED_PRECONDITION,
            RPCStatusCode.DEADLINE_EXCEEDED,
            RPCStatusCode.CANCELLED,
        ):
            raise
        record = await store.get_turn(chat_id)
        state = _state_of(record) if record else TurnState(chat_id=chat_id)
    if desc.status != WorkflowExecutionStatus.RUNNING:
        # A turn whose recovery failed has no run: the store holds its state.
        record = await store.get_turn(chat_id)
        if record is not None and record.status == TurnStatus.FAILED:
            state = _state_of(record)
    return JSONResponse(state.model_dump(mode="json"))


async def history(request: Request) -> Response:
    chat_id = chat_id_of(request)
    store = await backends(request).store()
    # Read first: a client that follows the events from here misses nothing the rows lack.
    seq = await store.follow_from(chat_id)
    rows = await store.history(chat_id)
    return JSONResponse([m.public() for m in rows], headers={"X-Event-Seq": str(seq)})


async def _decide(request: Request, action: Action) -> Response:
    from temporalio.client import WorkflowExecutionStatus

    chat_id = chat_id_of(request)
    recovery_id = _short_id(await read_json(request), "recovery_id", required=True)
    assert recovery_id is not None
    client = await backends(request).client()
    handle = client.get_workflow_handle(tk.workflow_id(chat_id))
    try:
        desc = await _described(handle, chat_id)
    except ApiError:
        if await (await backends(request).store()).get_turn(chat_id) is None:
            raise
        return await _decide_without_run(request, chat_id, action, recovery_id)  # its runs are gone
    if desc.status != WorkflowExecutionStatus.RUNNING:
        return await _decide_without_run(request, chat_id, action, recovery_id)
    try:
        state = await tk.decide(
            client, chat_id, action, recovery_id, run_id=desc.run_id, timeout=WORKER_TIMEOUT.total_seconds()
        )
    except tk.DecisionRefused as err:
        raise ApiError(409, str(err)) from None
    except tk.DecisionPending:
        raise ApiError(503, "no worker answered; start one with `turnkeeper worker`") from None
    return JSONResponse(state.model_dump(mode="json"))


async def _decide_without_run(request: Request, chat_id: str, action: Action, recovery_id: str) -> Response:
    """No run holds the turn: only one whose recovery failed can be decided, in the
    store, as the CLI does."""
    from turnkeeper.failed_turns import NotDecided, decide_failed_turn

    store = await backends(request).store()
    try:
        decided = await decide_failed_turn(store, chat_id, action, recovery_id)
    except NotDecided as err:
        raise ApiError(409, str(err)) from None
    return JSONResponse(decided.model_dump(mode="json"))


async def continue_turn(request: Request) -> Response:
    return await _decide(request, "continue")


async def dismiss_turn(request: Request) -> Response:
    return await _decide(request, "dismiss")


async def stop(request: Request) -> Response:
    from temporalio.client import WorkflowExecutionStatus

    chat_id = chat_id_of(request)
    await read_json(request)  # `{}`, bounded like any body
    handle = (await backends(request).client()).get_workflow_handle(tk.workflow_id(chat_id))
    not_running = f"no turn of chat {chat_id!r} is running"
    desc = await _described(handle, chat_id)
    if desc.status != WorkflowExecutionStatus.RUNNING:
        raise ApiError(409, not_running)
    try:
        await tk.decide(
            await backends(request).client(),
            chat_id,
            "stop",
            run_id=desc.run_id,
            timeout=WORKER_TIMEOUT.total_seconds(),
        )
    except tk.DecisionRefused as err:
        raise ApiError(409, f"{not_running}: {err}") from None
    except tk.DecisionPending:
        pass  # durable: a run without a worker now stops once one serves it
    return JSONResponse({}, status_code=202)
