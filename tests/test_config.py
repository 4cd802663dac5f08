"""Settings from the environment: defaults, parsing, clear errors."""
from __future__ import annotations

import pytest
from temporalio.worker import PollerBehaviorAutoscaling, PollerBehaviorSimpleMaximum

from turnkeeper.config import ConfigError, Settings
from worker import poller_behavior


def test_defaults_without_any_variable() -> None:
    settings = Settings.from_env({})
    assert settings == Settings(data_dir=settings.data_dir, workspace=settings.workspace)
    assert settings.workflow_sandbox is False
    assert settings.heartbeat_timeout == 3


@pytest.mark.parametrize("raw, expected", [
    ("on", True), ("1", True), ("TRUE", True), (" yes ", True),
    ("off", False), ("0", False), ("false", False), ("No", False), ("", False),
])
def test_workflow_sandbox_switch(raw: str, expected: bool) -> None:
    assert Settings.from_env({"TURNKEEPER_WORKFLOW_SANDBOX": raw}).workflow_sandbox is expected


def test_a_switch_that_is_neither_on_nor_off_is_refused() -> None:
    with pytest.raises(ConfigError, match="TURNKEEPER_WORKFLOW_SANDBOX must be one of .*'maybe'"):
        Settings.from_env({"TURNKEEPER_WORKFLOW_SANDBOX": "maybe"})


@pytest.mark.parametrize("raw, message", [
    ("soon", "must be a whole number, got 'soon'"),
    ("0", "must be at least 1, got 0"),
])
def test_a_bad_number_is_refused_with_its_name(raw: str, message: str) -> None:
    with pytest.raises(ConfigError, match=f"TURNKEEPER_HEARTBEAT_TIMEOUT {message}"):
        Settings.from_env({"TURNKEEPER_HEARTBEAT_TIMEOUT": raw})


@pytest.mark.parametrize("raw, expected", [("", None), ("auto", None), (" AUTO ", None), ("2", 2), ("20", 20)])
def test_pollers_autoscale_unless_a_fixed_maximum_is_given(raw: str, expected: int | None) -> None:
    settings = Settings.from_env({"TURNKEEPER_POLLERS": raw})
    assert settings.max_pollers == expected
    behavior = poller_behavior(settings)
    if expected is None:
        assert isinstance(behavior, PollerBehaviorAutoscaling)
    else:
        assert behavior == PollerBehaviorSimpleMaximum(expected)


@pytest.mark.parametrize("raw, message", [
    ("many", "must be `auto` or a whole number, got 'many'"),
    ("1", "must be at least 2, got 1"),
    ("-3", "must be `auto` or a whole number, got '-3'"),
])
def test_a_bad_poller_setting_is_refused_with_its_name(raw: str, message: str) -> None:
    with pytest.raises(ConfigError, match=f"TURNKEEPER_POLLERS {message}"):
        Settings.from_env({"TURNKEEPER_POLLERS": raw})
