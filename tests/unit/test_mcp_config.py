"""The MCP servers file: its shape, its `turnkeeper` key, and `${VAR}` references."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from turnkeeper.mcp_config import McpConfigError, ToolPolicy, expand, load, parse
from turnkeeper.models import EffectClass


def test_a_complete_file_reads_as_written(tmp_path: Path) -> None:
    path = tmp_path / "mcp.json"
    path.write_text(
        json.dumps(
            {
                "mcpServers": {
                    "git": {
                        "command": "mcp-server-git",
                        "args": ["--repository", "repo"],
                        "env": {"GIT_AUTHOR_NAME": "turnkeeper"},
                        "cwd": "/srv",
                        "turnkeeper": {
                            "approval": True,
                            "tools": {
                                "git_log": {"effect": "read", "approval": False},
                                "git_reset": {"enabled": False},
                            },
                        },
                    },
                    "search": {
                        "type": "http",
                        "url": "https://mcp.example/mcp",
                        "headers": {"Authorization": "Bearer ${SEARCH_TOKEN}"},
                        "turnkeeper": {"effect": "read", "connect_timeout": 5},
                    },
                }
            }
        )
    )
    git, search = load(path)
    assert (git.name, git.transport, git.command, git.args, git.cwd) == (
        "git",
        "stdio",
        "mcp-server-git",
        ("--repository", "repo"),
        "/srv",
    )
    assert git.env == {"GIT_AUTHOR_NAME": "turnkeeper"}
    # The tool's own entry wins over the server's; what neither says stays unset.
    assert git.policy("git_log") == ToolPolicy(effect=EffectClass.READ, approval=False)
    assert git.policy("git_commit") == ToolPolicy(effect=None, approval=True)
    assert git.policy("git_reset") == ToolPolicy(approval=True, enabled=False)
    assert (search.transport, search.url, search.connect_timeout) == ("http", "https://mcp.example/mcp", 5.0)
    # References stay as written until the worker connects, and headers stay out of reprs.
    assert search.headers == {"Authorization": "Bearer ${SEARCH_TOKEN}"}
    assert "SEARCH_TOKEN" not in repr(search)
    assert search.policy("anything") == ToolPolicy(effect=EffectClass.READ)


def test_keys_other_clients_write_are_ignored() -> None:
    (server,) = parse({"mcpServers": {"t": {"command": "x", "disabled": False, "autoApprove": []}}})
    assert server.command == "x"


@pytest.mark.parametrize(
    ("servers", "words"),
    [
        ({"bad name": {"command": "x"}}, "server name 'bad name'"),
        ({"a__b": {"command": "x"}}, "without '__'"),
        ({"t": {}}, "either a command (stdio) or a url"),
        ({"t": {"command": "x", "url": "http://h/mcp"}}, "either a command (stdio) or a url"),
        ({"t": {"command": ""}}, "command must be a non-empty string"),
        ({"t": {"command": "x", "args": "a b"}}, "args must be a list of strings"),
        ({"t": {"command": "x", "env": {"A": 1}}}, "env must be an object of strings"),
        ({"t": {"command": "x", "headers": {}}}, "headers go with a url"),
        ({"t": {"url": "ftp://h"}}, "url must be an http:// or https:// address"),
        ({"t": {"url": "http://h/mcp", "args": []}}, "args go with a command"),
        ({"t": {"url": "http://h/sse", "type": "sse"}}, "type 'sse' is not served"),
        ({"t": {"command": "x", "comand": "y"}}, "unknown keys ['comand']"),
        ({"t": {"command": "x", "turnkeeper": {"aproval": True}}}, "unknown keys ['aproval']"),
        (
            {"t": {"command": "x", "turnkeeper": {"effect": "delete"}}},
            "effect must be read, idempotent or write",
        ),
        ({"t": {"command": "x", "turnkeeper": {"approval": "yes"}}}, "approval must be true or false"),
        ({"t": {"command": "x", "turnkeeper": {"enabled": False}}}, "unknown keys ['enabled']"),
        ({"t": {"command": "x", "turnkeeper": {"connect_timeout": 0}}}, "connect_timeout must be"),
        (
            {"t": {"command": "x", "turnkeeper": {"tools": {"a": {"enabled": 0}}}}},
            "tool 'a': enabled must be",
        ),
    ],
)
def test_a_wrong_entry_is_refused_in_words(servers: dict, words: str) -> None:
    with pytest.raises(McpConfigError) as err:
        parse({"mcpServers": servers})
    assert words in str(err.value)


def test_the_file_itself_is_named_when_it_cannot_be_used(tmp_path: Path) -> None:
    for content, words in [
        ("{", "not valid JSON"),
        ('{"servers": {}}', 'expected {"mcpServers"'),
        ('{"mcpServers": {"x y": {"command": "c"}}}', "server name 'x y'"),
    ]:
        path = tmp_path / "mcp.json"
        path.write_text(content)
        with pytest.raises(McpConfigError, match=f"^{path}: .*{words}"):
            load(path)
    with pytest.raises(McpConfigError, match="cannot read it"):
        load(tmp_path / "missing.json")


def test_references_expand_from_the_environment_given() -> None:
    env = {"TOKEN": "s3cret", "EMPTY": ""}
    assert expand("Bearer ${TOKEN}", env) == "Bearer s3cret"
    assert expand("${EMPTY}-${UNSET:-fallback}", env) == "-fallback"
    assert expand("no $TOKEN braces", env) == "no $TOKEN braces"
    with pytest.raises(McpConfigError, match=r"header Authorization names \$\{UNSET\}, which is not set"):
        expand("Bearer ${UNSET}", env, where="header Authorization")
