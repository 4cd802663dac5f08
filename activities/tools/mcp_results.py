"""What the model reads of an MCP tool's result: its text, and a line naming each
image, audio clip or binary resource instead of its bytes (activities/tools/mcp.py)."""

from __future__ import annotations

import base64
import binascii
import json

import mcp_types as types


def render(result: types.CallToolResult) -> str:
    """Text as given; images, audio and binary resources as a line naming them (their
    bytes never reach the model or the transcript); structured content as JSON when
    no text came with it (servers are asked to send it as text too)."""
    parts: list[str] = []
    for block in result.content:
        if isinstance(block, types.TextContent):
            parts.append(block.text)
        elif isinstance(block, types.ImageContent | types.AudioContent):
            parts.append(f"[{block.type}: {block.mime_type}, {_decoded_size(block.data)} bytes, not shown]")
        elif isinstance(block, types.ResourceLink):
            parts.append(f"[resource link: {block.uri}" + (f" ({block.name})" if block.name else "") + "]")
        elif isinstance(block, types.EmbeddedResource):
            res = block.resource
            if isinstance(res, types.TextResourceContents):
                parts.append(f"[resource: {res.uri}]\n{res.text}")
            else:
                mime = f"{res.mime_type}, " if res.mime_type else ""
                parts.append(f"[resource: {res.uri}, {mime}{_decoded_size(res.blob)} bytes, not shown]")
    structured = result.structured_content
    if structured is not None and not any(isinstance(b, types.TextContent) for b in result.content):
        parts.append(json.dumps(structured, ensure_ascii=False))
    text = "\n".join(parts)
    if result.is_error:
        return text if text.startswith("Error") else f"Error: {text or 'the tool reported an error'}"
    return text


def _decoded_size(data: str) -> int:
    try:
        return len(base64.b64decode(data, validate=False))
    except (binascii.Error, ValueError):
        return len(data)
