"""Settings from the environment: defaults, parsing, clear errors."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import uvloop
from temporalio.worker import PollerBehaviorAutoscaling, PollerBehaviorSimpleMaximum

from turnkeeper.config import ConfigError, Settings, SubagentProfile
from turnkeeper.worker.main import WORKFLOW_TASK_POLLS, event_loop_factory, poller_behaviors


def test_defaults_without_any_variable() -> None:
    settings = Settings.from_env({})
    assert settings == Settings(data_dir=settings.data_dir, workspace=settings.workspace)
    assert settings.workflow_sandbox is False
    assert settings.heartbeat_timeout == 2


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("on", True),
        ("1", True),
        ("TRUE", True),
        (" yes ", True),
        ("off", False),
        ("0", False),
        ("false", False),
        ("No", False),
        ("", False),
    ],
)
def test_workflow_sandbox_switch(raw: str, expected: bool) -> None:
    assert Settings.from_env({"TURNKEEPER_WORKFLOW_SANDBOX": raw}).workflow_sandbox is expected


def test_a_switch_that_is_neither_on_nor_off_is_refused() -> None:
    with pytest.raises(ConfigError, match="TURNKEEPER_WORKFLOW_SANDBOX must be one of .*'maybe'"):
        Settings.from_env({"TURNKEEPER_WORKFLOW_SANDBOX": "maybe"})


@pytest.mark.parametrize(
    "raw, message",
    [
        ("soon", "must be a whole number, got 'soon'"),
        ("0", "must be at least 1, got '0'"),
    ],
)
def test_a_bad_number_is_refused_with_its_name(raw: str, message: str) -> None:
    with pytest.raises(ConfigError, match=f"TURNKEEPER_HEARTBEAT_TIMEOUT {message}"):
        Settings.from_env({"TURNKEEPER_HEARTBEAT_TIMEOUT": raw})


@pytest.mark.parametrize(
    "raw, expected", [("", None), ("auto", None), (" AUTO ", None), ("2", 2), ("20", 20)]
)
def test_pollers_default_or_a_fixed_maximum(raw: str, expected: int | None) -> None:
    settings = Settings.from_env({"TURNKEEPER_POLLERS": raw})
    assert settings.max_pollers == expected
    pollers = poller_behaviors(settings)
    if expected is None:
        # Enough workflow-task polls that sticky tasks find one waiting; activities autoscale.
        assert pollers.workflow_tasks == PollerBehaviorSimpleMaximum(WORKFLOW_TASK_POLLS)
        assert isinstance(pollers.activity_tasks, PollerBehaviorAutoscaling)
    else:
        assert pollers.workflow_tasks == pollers.activity_tasks == PollerBehaviorSimpleMaximum(expected)


@pytest.mark.parametrize(
    "raw, message",
    [
        ("many", "must be `auto` or a whole number, got 'many'"),
        ("1", "must be at least 2, got '1'"),
        ("-3", "must be `auto` or a whole number, got '-3'"),
    ],
)
def test_a_bad_poller_setting_is_refused_with_its_name(raw: str, message: str) -> None:
    with pytest.raises(ConfigError, match=f"TURNKEEPER_POLLERS {message}"):
        Settings.from_env({"TURNKEEPER_POLLERS": raw})


@pytest.mark.parametrize(
    "raw, expected",
    [
        ("", "auto"),
        ("auto", "auto"),
        (" UVLOOP ", "uvloop"),
        ("asyncio", "asyncio"),
    ],
)
def test_event_loop_choice(raw: str, expected: str) -> None:
    assert Settings.from_env({"TURNKEEPER_EVENT_LOOP": raw}).event_loop == expected
    assert Settings.from_env({}).event_loop == "auto"


def test_an_unknown_event_loop_is_refused() -> None:
    with pytest.raises(
        ConfigError, match="TURNKEEPER_EVENT_LOOP must be one of auto, uvloop, asyncio, got 'trio'"
    ):
        Settings.from_env({"TURNKEEPER_EVENT_LOOP": "trio"})


def test_the_worker_runs_on_uvloop_unless_asyncio_is_asked_for() -> None:
    assert event_loop_factory("auto") is uvloop.new_event_loop
    assert event_loop_factory("uvloop") is uvloop.new_event_loop
    assert event_loop_factory("asyncio") is None


def test_without_uvloop_auto_falls_back_and_uvloop_is_a_clear_error(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "uvloop", None)  # as on a platform it does not build on
    assert event_loop_factory("auto") is None
    with pytest.raises(ConfigError, match="TURNKEEPER_EVENT_LOOP=uvloop, but uvloop is not installed"):
        event_loop_factory("uvloop")


def test_a_temporal_toml_profile_gives_the_address_and_namespace(tmp_path: Path) -> None:
    config = tmp_path / "temporal.toml"
    config.write_text('[profile.default]\naddress = "temporal.example:7233"\nnamespace = "prod"\n')
    env = {"TEMPORAL_CONFIG_FILE": str(config)}
    s = Settings.from_env(env)
    assert (s.temporal_address, s.namespace) == ("temporal.example:7233", "prod")
    s = Settings.from_env({**env, "TEMPORAL_ADDRESS": "other:7233", "TEMPORAL_NAMESPACE": "dev"})
    assert (s.temporal_address, s.namespace) == ("other:7233", "dev")  # the variables win
    home = tmp_path / "home"
    (home / ".config" / "temporalio").mkdir(parents=True)
    (home / ".config" / "temporalio" / "temporal.toml").write_text(config.read_text())
    assert Settings.from_env({"HOME": str(home)}).temporal_address == "temporal.example:7233"
    assert Settings.from_env({"HOME": str(tmp_path)}).temporal_address is None  # no file: embedded
    with pytest.raises(ConfigError, match=r"has no \[profile.staging\]"):
        Settings.from_env({**env, "TEMPORAL_PROFILE": "staging"})
    config.write_text("[profile.default\n")
    with pytest.raises(ConfigError, match="Temporal config file"):
        Settings.from_env(env)


# -- subagents ---------------------------------------------------------------------------


def test_subagent_limits_and_profiles_default_to_none() -> None:
    settings = Settings.from_env({})
    assert (settings.subagent_max_depth, settings.subagent_max_fanout) == (2, 4)
    assert settings.subagent_profiles == ()
    assert "delegate" not in settings.tools  # enabled only when listed


def test_subagent_profiles_are_read_from_json() -> None:
    raw = (
        '{"reviewer": {"instructions": "Review; never edit.", "tools": ["read_file", " list_dir", "read_file"]},'
        ' "writer": {"instructions": "", "tools": [], "model": "openai:gpt-4o-mini"}}'
    )
    settings = Settings.from_env(
        {
            "TURNKEEPER_SUBAGENT_PROFILES": raw,
            "TURNKEEPER_SUBAGENT_MAX_DEPTH": "1",
            "TURNKEEPER_SUBAGENT_MAX_FANOUT": "8",
        }
    )
    reviewer = settings.subagent_profile("reviewer")
    assert reviewer == SubagentProfile("reviewer", "Review; never edit.", ("read_file", "list_dir"))
    writer = settings.subagent_profile("writer")
    assert writer is not None and (writer.tools, writer.model) == ((), "openai:gpt-4o-mini")
    assert settings.subagent_profile("nobody") is None
    assert (settings.subagent_max_depth, settings.subagent_max_fanout) == (1, 8)


@pytest.mark.parametrize(
    "raw, message",
    [
        ("{reviewer: 1}", r"TURNKEEPER_SUBAGENT_PROFILES: not JSON \(.* at character 1\); expected \{"),
        ('["reviewer"]', "TURNKEEPER_SUBAGENT_PROFILES: expected a JSON object of profiles"),
        ('{"a b": {"instructions": "", "tools": []}}', "profile 'a b': a profile name is 1-64 characters"),
        ('{"r": "read only"}', "profile 'r' is not an object"),
        ('{"r": {"tools": []}}', "profile 'r': 'instructions' must be a string"),
        ('{"r": {"instructions": "x", "tools": "read_file"}}', "profile 'r': 'tools' must be a list"),
        ('{"r": {"instructions": "x", "tools": [1]}}', "profile 'r': 'tools' must be a list of tool names"),
        ('{"r": {"instructions": "x", "tools": [], "model": 3}}', "profile 'r': 'model' must be"),
        ('{"r": {"instructions": "x", "tools": [], "tool": []}}', r"profile 'r': unknown keys \['tool'\]"),
    ],
)
def test_a_bad_profiles_value_is_refused_naming_the_variable(raw: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message) as refused:
        Settings.from_env({"TURNKEEPER_SUBAGENT_PROFILES": raw})
    assert str(refused.value).startswith("TURNKEEPER_SUBAGENT_PROFILES")


@pytest.mark.parametrize("name", ["TURNKEEPER_SUBAGENT_MAX_DEPTH", "TURNKEEPER_SUBAGENT_MAX_FANOUT"])
def test_subagent_limits_are_at_least_one(name: str) -> None:
    with pytest.raises(ConfigError, match=f"{name} must be at least 1, got '0'"):
        Settings.from_env({name: "0"})
