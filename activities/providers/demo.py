"""An offline, deterministic stand-in for a model, so a newcomer can watch a tool
call run as an activity without an API key.

It looks only at the last history row:
- a tool row: a final answer summarising the tool results of this turn;
- a user row `write <path>: <content>`, `read <path>`, `list` / `ls [path]`,
  `run <command>`: a call to write_file / read_file / list_dir / exec (if that
  tool is enabled); `call <tool> {json arguments}`: a call to any enabled tool
  (an MCP server's `<server>__<tool>` among them); `delegate: <task>`,
  `delegate in background: <task>`, `delegate as <profile>: <task>` (they
  combine): a `delegate` call, whose sub-chat's first message is the task, which
  the demo model there reads like any message; `delegate each: <task> | <task>`:
  one call per task, in one reply (they run in parallel);
- a background subagent's report: an acknowledgement quoting it;
- anything else: a friendly echo with a hint.
"""

from __future__ import annotations

import json
import re

from turnkeeper.activities.providers.base import (
    ModelProvider,
    SummaryRequest,
    TextSink,
    fallback_tool_call_id,
    listed_summary,
    stream_words,
)
from turnkeeper.models import ChatMessage, ModelReply, ToolCall, ToolSpec

HINT = 'Try "write notes.txt: hello", "read notes.txt" or "list".'
MAX_RESULT_CHARS = 500
# Slow enough to watch the answer arrive, quick enough not to wait for it.
WORD_DELAY_S = 0.02

_WRITE = re.compile(r"^write\s+(?P<path>[^:\n]+?)\s*:[ \t]?(?P<content>.*)\Z", re.I | re.S)
_READ = re.compile(r"^read\s+(?P<path>\S.*?)\s*\Z", re.I | re.S)
_RUN = re.compile(r"^run\s+(?P<command>\S.*?)\s*\Z", re.I | re.S)
_LIST = re.compile(r"^(?:list|ls)(?:\s+(?P<path>\S.*?))?\s*\Z", re.I | re.S)
_DELEGATE = re.compile(
    r"^delegate(?P<options>(?:\s+as\s+[A-Za-z0-9._-]+|\s+in\s+(?:the\s+)?background|\s+each)*)\s*:\s*(?P<task>\S.*)\Z",
    re.I | re.S,
)
_PROFILE = re.compile(r"\sas\s+(?P<profile>[A-Za-z0-9._-]+)", re.I)
# activities/subagent_activities.py's report heads.
_REPORT = re.compile(
    r"^Subagent \(chat (?P<chat>[^,]+), task: .*?\) (?P<how>answered|ended without an answer):\n", re.S
)
_CALL = re.compile(r"^call\s+(?P<tool>[A-Za-z0-9_-]+)(?:\s+(?P<arguments>\{.*\}))?\s*\Z", re.S)


def _parse_command(text: str) -> list[tuple[str, dict[str, object]]] | None:
    text = text.strip()
    if m := _DELEGATE.match(text):
        options = m["options"].lower()
        tasks = (
            [t.strip() for t in m["task"].split("|")] if "each" in options.split() else [m["task"].strip()]
        )
        calls = []
        for task in filter(None, tasks):
            arguments: dict[str, object] = {"task": task}
            arguments["mode"] = "background" if "background" in options else "wait"
            if profile := _PROFILE.search(m["options"]):
                arguments["profile"] = profile["profile"]
            calls.append(("delegate", arguments))
        return calls or None
    if m := _WRITE.match(text):
        return [("write_file", {"path": m["path"], "content": m["content"]})]
    if m := _READ.match(text):
        return [("read_file", {"path": m["path"]})]
    if m := _RUN.match(text):
        return [("exec", {"command": m["command"]})]
    if m := _LIST.match(text):
        return [("list_dir", {"path": m["path"] or "."})]
    if m := _CALL.match(text):
        try:
            arguments = json.loads(m["arguments"] or "{}")
        except json.JSONDecodeError:
            return None
        return [(m["tool"], arguments)] if isinstance(arguments, dict) else None
    return None


def _summarise_tool_results(history: list[ChatMessage]) -> str:
    last_user = max((i for i, m in enumerate(history) if m.role == "user"), default=-1)
    names = {c.id: c.name for m in history for c in (m.tool_calls or ())}
    lines: list[str] = []
    failed = False
    for m in history[last_user + 1 :]:
        if m.role != "tool":
            continue
        name = m.name or names.get(m.tool_call_id or "", "tool")
        content = (m.content or "").strip()
        failed = failed or content.lower().startswith("error")
        if len(content) > MAX_RESULT_CHARS:
            content = content[:MAX_RESULT_CHARS] + "…"
        lines.append(f"{name}: {content}")
    lead = "That did not work." if failed else "Done."
    return f"{lead} " + "\n".join(lines)


class DemoProvider(ModelProvider):
    name = "demo"

    def __init__(self, word_delay_s: float = WORD_DELAY_S) -> None:
        self.word_delay_s = word_delay_s

    async def summarise(self, request: SummaryRequest) -> str:
        return listed_summary(request)

    async def complete(
        self,
        history: list[ChatMessage],
        tools: list[ToolSpec],
        *,
        call_index: int,
        on_text: TextSink | None = None,
    ) -> ModelReply:
        return await stream_words(self._reply(history, tools, call_index), on_text, self.word_delay_s)

    def _reply(self, history: list[ChatMessage], tools: list[ToolSpec], call_index: int) -> ModelReply:
        if not history:
            return ModelReply(text=f"Hello! I am the offline demo model. {HINT}")
        last = history[-1]
        if last.role == "tool":
            return ModelReply(text=_summarise_tool_results(history))
        if last.role != "user":
            return ModelReply(text=f"I am the offline demo model. {HINT}")

        text = last.content or ""
        if report := _REPORT.match(text):
            lead = "A subagent reported back" if report["how"] == "answered" else "A subagent stopped short"
            return ModelReply(text=f"{lead} (chat {report['chat']}): {text[report.end() :].strip()}")
        command = _parse_command(text)
        if command is None:
            return ModelReply(text=f'You said: "{text.strip()}". I am the offline demo model. {HINT}')
        tool_name = command[0][0]
        enabled = [t.name for t in tools]
        if tool_name not in enabled:
            listing = ", ".join(enabled) if enabled else "none"
            return ModelReply(
                text=f"The {tool_name} tool is not enabled, so I can't do that. Enabled tools: {listing}."
            )
        return ModelReply(
            tool_calls=[
                ToolCall(id=fallback_tool_call_id(call_index, i), name=name, arguments=json.dumps(arguments))
                for i, (name, arguments) in enumerate(command)
            ]
        )
