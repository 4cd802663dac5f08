"""The API's OpenAPI description, served at /openapi.json (written by hand: the
handlers are plain Starlette)."""

from __future__ import annotations

from typing import Any

_CHAT_ID = {
    "name": "chat_id",
    "in": "path",
    "required": True,
    "schema": {"type": "string", "pattern": "^[A-Za-z0-9._:-]{1,128}$"},
}
_ERROR = {"$ref": "#/components/schemas/Error"}
_STATE = {"$ref": "#/components/schemas/TurnState"}


def _json(description: str, schema: dict[str, Any] | None = None) -> dict[str, Any]:
    answer: dict[str, Any] = {"description": description}
    if schema is not None:
        answer["content"] = {"application/json": {"schema": schema}}
    return answer


def _errors(*codes: int) -> dict[str, Any]:
    words = {
        401: "no or wrong token (only with TURNKEEPER_WEB_TOKEN set)",
        404: "unknown chat",
        403: "a write from another site, or (without a token) a request to a name that is not loopback",
        415: "the body is not sent as application/json",
        409: "refused; `detail` says why",
        413: "over the size limit",
        422: "malformed chat id or body",
        503: "Temporal or the store does not answer",
    }
    return {str(c): _json(words[c], _ERROR) for c in codes}


def _body(schema: dict[str, Any]) -> dict[str, Any]:
    return {"required": True, "content": {"application/json": {"schema": schema}}}


_RECOVERY = _body(
    {"type": "object", "required": ["recovery_id"], "properties": {"recovery_id": {"type": "string"}}}
)


def _decision(verb: str) -> dict[str, Any]:
    return {
        "post": {
            "summary": f"{verb} the waiting turn (the recovery id the client saw)",
            "parameters": [_CHAT_ID],
            "requestBody": _RECOVERY,
            "responses": {
                "200": _json("the new state", _STATE),
                **_errors(401, 403, 404, 409, 413, 415, 422, 503),
            },
        }
    }


SPEC: dict[str, Any] = {
    "openapi": "3.1.0",
    "info": {"title": "turnkeeper web API", "version": "1"},
    "components": {
        "securitySchemes": {
            "bearer": {"type": "http", "scheme": "bearer"},
            "session": {"type": "apiKey", "in": "cookie", "name": "turnkeeper_session"},
        },
        "schemas": {
            "Error": {"type": "object", "properties": {"detail": {"type": "string"}}},
            "TurnState": {
                "type": "object",
                "description": "the workflow's `state` query (docs/contract.md)",
                "properties": {
                    "chat_id": {"type": "string"},
                    "turn": {"type": "integer"},
                    "status": {
                        "enum": ["running", "awaiting_user", "resuming", "completed", "recovered", "failed"]
                    },
                    "reason": {"type": ["string", "null"]},
                    "recovery_id": {"type": ["string", "null"]},
                    "can_continue": {"type": "boolean"},
                    "attempts": {"type": "integer"},
                    "pending_followups": {"type": "array", "items": {"type": "string"}},
                    "tool_calls": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": {
                                "id": {"type": "string"},
                                "name": {"type": "string"},
                                "status": {"enum": ["pending", "running", "done", "error", "interrupted"]},
                            },
                        },
                    },
                    "detail": {"type": ["string", "null"]},
                    "store_unavailable": {"type": "boolean"},
                    "approvals": {
                        "type": "array",
                        "description": "with `approval_required`: the calls Continue approves",
                        "items": {
                            "type": "object",
                            "properties": {
                                "id": {"type": "string"},
                                "name": {"type": "string"},
                                "arguments": {"type": "string"},
                                "idempotency_key": {"type": "string"},
                            },
                        },
                    },
                    "decisions": {
                        "type": "array",
                        "description": "the latest decisions that carried a `request_id`, oldest first",
                        "items": {
                            "type": "object",
                            "properties": {
                                "request_id": {"type": "string"},
                                "action": {"enum": ["continue", "dismiss", "stop"]},
                                "refusal": {"type": ["string", "null"]},
                            },
                        },
                    },
                    "subagents": {"type": "array", "items": {"$ref": "#/components/schemas/Subagent"}},
                    "delegated_by": {
                        "type": ["string", "null"],
                        "description": "in a sub-chat: the chat whose turn delegated it",
                    },
                },
            },
            "Subagent": {
                "type": "object",
                "description": (
                    "a subagent of the turn (docs/subagents.md): a chat of its own, "
                    "`GET /api/chats/{chat_id}` and its transcript like any chat's"
                ),
                "properties": {
                    "chat_id": {"type": "string"},
                    "workflow_id": {"type": "string"},
                    "tool_call_id": {"type": "string"},
                    "task": {"type": "string", "description": "the task's first 200 characters"},
                    "mode": {"enum": ["wait", "background"]},
                    "status": {
                        "enum": ["running", "awaiting_user", "resuming", "completed", "recovered", "failed"]
                    },
                    "reason": {"type": ["string", "null"]},
                    "recovery_id": {"type": ["string", "null"]},
                    "can_continue": {"type": "boolean"},
                },
            },
            "Message": {
                "type": "object",
                "required": ["role", "content"],
                "properties": {
                    "role": {"enum": ["user", "assistant", "tool"]},
                    "content": {"type": ["string", "null"]},
                    "tool_calls": {"type": "array", "items": {"type": "object"}},
                    "tool_call_id": {"type": "string"},
                    "name": {"type": "string"},
                },
            },
        },
    },
    "security": [{"bearer": []}, {"session": []}],
    "paths": {
        "/api/chats": {
            "get": {
                "summary": "chats by their latest turn, newest first",
                "responses": {
                    "200": _json(
                        "the chats",
                        {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "properties": {
                                    "chat_id": {"type": "string"},
                                    "turn": {"type": "integer"},
                                    "status": {"type": "string"},
                                    "reason": {"type": ["string", "null"]},
                                    "updated_at": {"type": "string", "format": "date-time"},
                                },
                            },
                        },
                    ),
                    **_errors(401, 503),
                },
            }
        },
        "/api/chats/{chat_id}": {
            "get": {
                "summary": "the turn's state",
                "parameters": [_CHAT_ID],
                "responses": {"200": _json("the state", _STATE), **_errors(401, 404, 422, 503)},
            }
        },
        "/api/chats/{chat_id}/messages": {
            "get": {
                "summary": "the committed transcript, as `turnkeeper history --json`",
                "parameters": [_CHAT_ID],
                "responses": {
                    "200": {
                        **_json(
                            "the rows in order",
                            {"type": "array", "items": {"$ref": "#/components/schemas/Message"}},
                        ),
                        "headers": {
                            "X-Event-Seq": {
                                "description": "the event log's seq when the rows were read: follow the events "
                                "from there",
                                "schema": {"type": "integer"},
                            }
                        },
                    },
                    **_errors(401, 422, 503),
                },
            },
            "post": {
                "summary": "send a message (the same message_id twice is one message)",
                "parameters": [_CHAT_ID],
                "requestBody": _body(
                    {
                        "type": "object",
                        "required": ["text"],
                        "properties": {
                            "text": {"type": "string"},
                            "message_id": {"type": "string", "maxLength": 200},
                        },
                    }
                ),
                "responses": {
                    "202": _json(
                        "durable in the chat's workflow",
                        {"type": "object", "properties": {"message_id": {"type": "string"}}},
                    ),
                    **_errors(401, 403, 413, 415, 422, 503),
                },
            },
        },
        "/api/chats/{chat_id}/continue": _decision("Continue"),
        "/api/chats/{chat_id}/dismiss": _decision("Dismiss"),
        "/api/chats/{chat_id}/stop": {
            "post": {
                "summary": "Stop the running turn",
                "parameters": [_CHAT_ID],
                "responses": {
                    "202": _json("the stop is durable; the turn ends recovered/stopped"),
                    **_errors(401, 403, 404, 409, 422, 503),
                },
            }
        },
        "/api/chats/{chat_id}/events": {
            "get": {
                "summary": "the chat's event log as Server-Sent Events (id: seq, event: type, data: payload)",
                "parameters": [
                    _CHAT_ID,
                    {"name": "Last-Event-ID", "in": "header", "schema": {"type": "integer"}},
                    {"name": "after", "in": "query", "schema": {"type": "integer"}},
                ],
                "responses": {
                    "200": {"description": "the stream", "content": {"text/event-stream": {}}},
                    **_errors(401, 422, 503),
                },
            }
        },
        "/healthz": {
            "get": {
                "summary": "200 when Temporal and the store answer",
                "security": [],
                "responses": {"200": _json("both answer"), "503": _json("one does not")},
            }
        },
        "/login": {
            "post": {
                "summary": "exchange the token for the session cookie (HttpOnly, SameSite=Strict)",
                "security": [],
                "requestBody": _body({"type": "object", "properties": {"token": {"type": "string"}}}),
                "responses": {
                    "204": _json("logged in"),
                    "401": _json("wrong token", _ERROR),
                    "429": _json(
                        "10 failed logins from this address within a minute: "
                        "try again after Retry-After seconds",
                        _ERROR,
                    ),
                },
            }
        },
        "/logout": {
            "post": {
                "summary": "forget the session cookie",
                "security": [],
                "responses": {"204": _json("logged out")},
            }
        },
    },
}
