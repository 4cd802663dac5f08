"""docker-compose.yml and the Dockerfile stay consistent with the code (no Docker needed)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import shlex
import tomllib
from typing import Any
from urllib.parse import urlsplit

import pytest
import yaml

from tests.support import ROOT
from turnkeeper import config
from turnkeeper.config import Settings
from turnkeeper.store import PostgresStore, open_store
from turnkeeper.worker.dev_server import HISTORY_LIMITS, TASK_DISPATCH, TASK_PROBLEMS

COMPOSE = ROOT / "docker-compose.yml"
DOCKERFILE = ROOT / "Dockerfile"

_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?:(:?-)([^}]*))?\}")


def interpolate(value: str, env: dict[str, str] | None = None) -> str:
    """Compose's `${VAR}` / `${VAR:-default}` / `$$`, with `env` (empty: the defaults)."""
    env = env or {}

    def sub(m: re.Match[str]) -> str:
        name, op, default = m.group(1), m.group(2), m.group(3) or ""
        if op == ":-":
            return env.get(name) or default
        if op == "-":
            return env.get(name, default)
        return env.get(name, "")

    return _VAR.sub(sub, value.replace("$$", "\0")).replace("\0", "$")


def environment(service: dict[str, Any]) -> dict[str, str]:
    env = service.get("environment") or {}
    if isinstance(env, list):  # the KEY=value form
        env = dict(item.split("=", 1) if "=" in item else (item, "") for item in env)
    return {str(k): interpolate(str(v)) for k, v in env.items()}


def seconds(duration: str) -> float:
    units = {"h": 3600, "m": 60, "s": 1, "ms": 0.001}
    total = 0.0
    for number, unit in re.findall(r"(\d+(?:\.\d+)?)(ms|h|m|s)", duration):
        total += float(number) * units[unit]
    return total


@pytest.fixture(scope="module")
def compose() -> dict[str, Any]:
    return yaml.safe_load(COMPOSE.read_text())


@pytest.fixture(scope="module")
def services(compose: dict[str, Any]) -> dict[str, dict[str, Any]]:
    return compose["services"]


@pytest.fixture(scope="module")
def worker_env(services: dict[str, dict[str, Any]]) -> dict[str, str]:
    return environment(services["worker"])


def _image(service: dict[str, Any]) -> str:
    return str(service.get("image", ""))


def _port_pairs(service: dict[str, Any]) -> list[tuple[str, str]]:
    pairs = []
    for port in service.get("ports", []):
        if isinstance(port, dict):  # long syntax
            pairs.append((str(port.get("published")), str(port.get("target"))))
        else:
            host, _, container = str(port).rpartition(":")
            pairs.append((host.rpartition(":")[2], container.split("/")[0]))
    return pairs


# -- services -------------------------------------------------------------------------------


def test_the_stack_has_its_services(services: dict[str, dict[str, Any]]) -> None:
    for name in ("temporal", "temporal-ui", "temporal-postgresql", "session-postgresql", "worker"):
        assert name in services, f"docker-compose.yml has no service {name!r}"
    assert _image(services["temporal"]).startswith("temporalio/")
    assert _image(services["temporal-ui"]).startswith("temporalio/ui:")
    for db in ("temporal-postgresql", "session-postgresql"):
        assert _image(services[db]).startswith("postgres:")
    for name, service in services.items():
        image = _image(service)
        if image:
            assert ":" in image and not image.endswith(":latest"), (
                f"{name}: pin the image version ({image!r})"
            )


def test_temporal_persists_in_its_own_postgresql(services: dict[str, dict[str, Any]]) -> None:
    env = environment(services["temporal"])
    assert env["DB"].startswith("postgres")
    assert env["POSTGRES_SEEDS"] == "temporal-postgresql"
    db_env = environment(services["temporal-postgresql"])
    assert (env["POSTGRES_USER"], env["POSTGRES_PWD"]) == (
        db_env["POSTGRES_USER"],
        db_env["POSTGRES_PASSWORD"],
    )


def test_temporal_and_its_ui_are_published_on_the_dev_server_ports(
    services: dict[str, dict[str, Any]],
) -> None:
    assert ("7233", "7233") in _port_pairs(services["temporal"])
    assert ("7243", "7243") in _port_pairs(services["temporal"])  # the HTTP API `status` asks
    assert ("8233", "8080") in _port_pairs(services["temporal-ui"])
    assert environment(services["temporal-ui"])["TEMPORAL_ADDRESS"] == "temporal:7233"


def test_dependencies_wait_for_healthy_services(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        depends = service.get("depends_on") or {}
        assert isinstance(depends, dict), f"{name}: depends_on needs conditions, not a bare list"
        for target, spec in depends.items():
            assert target in services, f"{name} depends on unknown service {target!r}"
            assert spec.get("condition") == "service_healthy", f"{name} -> {target}: wait until healthy"
            assert "healthcheck" in services[target], f"{target} needs a healthcheck ({name} waits for it)"
    worker_deps = set(services["worker"]["depends_on"])
    assert {"temporal", "session-postgresql"} <= worker_deps
    assert "temporal-postgresql" in services["temporal"]["depends_on"]


def _mounts(service: dict[str, Any]) -> dict[str, str]:
    """container path -> host path of a service's bind mounts (short syntax or long)."""
    mounts = {}
    for volume in service.get("volumes", []):
        if isinstance(volume, dict):
            mounts[str(volume["target"])] = str(volume.get("source", ""))
        else:
            host, container = str(volume).split(":")[:2]
            mounts[container] = host
    return mounts


def test_temporal_runs_with_the_projects_dynamic_config(services: dict[str, dict[str, Any]]) -> None:
    """The server reads deploy/temporal/dynamicconfig.yaml: mounted where
    DYNAMIC_CONFIG_FILE_PATH points, valid, and without the 50 ms dispatch tick."""
    temporal = services["temporal"]
    env = environment(temporal)
    path = env["DYNAMIC_CONFIG_FILE_PATH"]
    if not path.startswith("/"):  # auto-setup resolves a relative path from /etc/temporal
        path = f"/etc/temporal/{path}"
    mounts = _mounts(temporal)
    assert path in mounts, f"nothing is mounted at {path}: {mounts}"
    host = (ROOT / mounts[path]).resolve()
    assert host == ROOT / "deploy" / "temporal" / "dynamicconfig.yaml"

    config = yaml.safe_load(host.read_text())
    assert isinstance(config, dict) and config
    for key, values in config.items():
        assert re.fullmatch(r"[a-z]+\.[A-Za-z0-9.]+", key), f"not a dynamic config key: {key!r}"
        assert isinstance(values, list) and values, f"{key}: a list of values"
        for value in values:
            assert set(value) <= {"value", "constraints"} and "value" in value, f"{key}: {value!r}"
    # Every queue the embedded server reads without the tick is also read faster
    # than the server's default (20 a second per shard) here, with a per-host cap.
    for key in TASK_DISPATCH:
        assert config[key][0]["value"] > 20, key
        host_cap = key.replace("MaxPollRPS", "MaxPollHostRPS")
        assert config[host_cap][0]["value"] >= config[key][0]["value"], host_cap
    # The cap on a run's signals that keeps every history quick to replay, as the embedded server's.
    for key, value in HISTORY_LIMITS.items():
        assert config[key][0]["value"] == value, key
    # Runs whose task keeps failing are marked, so the reconciler finds those with no open turn.
    for key, value in TASK_PROBLEMS.items():
        assert config[key][0]["value"] == value, key
    # The shard count is fixed once the database exists: set, not left to the image.
    assert int(env["NUM_HISTORY_SHARDS"]) >= 1


def test_temporal_healthcheck_waits_for_the_namespace(
    services: dict[str, dict[str, Any]], worker_env: dict[str, str]
) -> None:
    test = services["temporal"]["healthcheck"]["test"]
    command = " ".join(test[1:]) if isinstance(test, list) else str(test)
    assert "namespace describe" in command and "temporal:7233" in command
    temporal_env = environment(services["temporal"])
    assert temporal_env["DEFAULT_NAMESPACE"] == worker_env["TEMPORAL_NAMESPACE"]


# -- the worker -----------------------------------------------------------------------------


def test_each_variable_is_read_by_one_field_and_matters() -> None:
    """`config.ENV_VARS` are `Settings`' variables: each read once, and each, set alone,
    changes the settings."""
    assert len(config.ENV_VARS) == len(set(config.ENV_VARS))
    key = "k1:" + "A" * 43 + "="
    values = ("value-x", "4242", "on", "off", "asyncio", "debug", "127.0.0.1:4242", "http://x.example", key)
    defaults = Settings.from_env({})
    for name in config.ENV_VARS:
        changed = []
        for value in values:
            with contextlib.suppress(config.ConfigError):
                changed.append(Settings.from_env({name: value}) != defaults)
        assert any(changed), f"{name} changes nothing"


def test_worker_environment_is_exactly_what_the_worker_reads(worker_env: dict[str, str]) -> None:
    known = set(config.ENV_VARS) | set(config.TEMPORAL_CONNECTION_ENV_VARS)
    unknown = sorted(set(worker_env) - known)
    assert not unknown, f"the worker reads no such variables: {unknown}"
    # No dev server in the stack; the CLI's own variables are set where the CLI runs.
    expected = set(config.ENV_VARS) - set(config.DEV_SERVER_ENV_VARS) - set(config.CLI_ONLY_ENV_VARS)
    missing = sorted(expected - set(worker_env))
    assert not missing, f"pass these through to the worker (with defaults): {missing}"
    assert not set(config.DEV_SERVER_ENV_VARS) & set(worker_env)


def test_worker_settings_with_the_defaults(
    services: dict[str, dict[str, Any]], worker_env: dict[str, str]
) -> None:
    settings = Settings.from_env(worker_env)  # ConfigError if a default does not parse
    assert settings.temporal_address == "temporal:7233"
    assert settings.tools == config.DEFAULT_TOOLS and settings.tool_modules == ()
    # Everything the stack does not set on purpose keeps the defaults it has outside Docker.
    own = {"temporal_address", "data_dir", "database_url", "workspace"}
    defaults = Settings()
    for field in dataclasses.fields(Settings):
        if field.name not in own:
            assert getattr(settings, field.name) == getattr(defaults, field.name), (
                f"{field.name}: compose default differs"
            )

    # The session store: PostgreSQL, on a service of the stack whose credentials match.
    store = open_store(settings)
    assert isinstance(store, PostgresStore)
    url = urlsplit(worker_env["TURNKEEPER_DATABASE_URL"])
    assert url.hostname in services and url.hostname != "temporal-postgresql"
    db_env = environment(services[url.hostname])
    assert (url.username, url.password, url.path.lstrip("/")) == (
        db_env["POSTGRES_USER"],
        db_env["POSTGRES_PASSWORD"],
        db_env["POSTGRES_DB"],
    )


def test_worker_scales_and_shuts_down_gracefully(
    services: dict[str, dict[str, Any]], worker_env: dict[str, str]
) -> None:
    worker = services["worker"]
    assert "container_name" not in worker and "ports" not in worker  # or replicas would collide
    assert int(worker.get("deploy", {}).get("replicas", 1)) >= 2
    grace = int(worker_env["TURNKEEPER_SHUTDOWN_GRACE"])
    assert seconds(str(worker["stop_grace_period"])) > grace
    assert worker.get("stop_signal", "SIGTERM") == "SIGTERM"


def test_worker_is_built_from_the_dockerfile(services: dict[str, dict[str, Any]]) -> None:
    build = services["worker"]["build"]
    context, dockerfile = (
        (build, "Dockerfile")
        if isinstance(build, str)
        else (build.get("context", "."), build.get("dockerfile", "Dockerfile"))
    )
    assert (ROOT / context).resolve() == ROOT
    assert (ROOT / context / dockerfile).resolve() == DOCKERFILE


def test_the_ui_decodes_through_the_codec_server(services: dict[str, dict[str, Any]]) -> None:
    """codec-server is the worker's image running `turnkeeper codec-server` with the
    workers' keys, published on loopback where the UI's page looks for it, and it
    lets that page's origin in."""
    from turnkeeper.payloads.codec_server import CodecConfig

    codec, worker = services["codec-server"], services["worker"]
    assert codec["command"] == ["turnkeeper", "codec-server"] and codec["build"] == worker["build"]
    keys = "TURNKEEPER_ENCRYPTION_KEYS"
    assert codec["environment"][keys] == worker["environment"][keys]  # the same variable, as written
    env = environment(codec)
    config = CodecConfig.from_settings(Settings.from_env(env))  # ConfigError if a default does not parse
    assert [str(p) for p in codec["ports"]] == [f"127.0.0.1:{config.port}:{config.port}"]
    endpoint = urlsplit(environment(services["temporal-ui"])["TEMPORAL_CODEC_ENDPOINT"])
    assert (endpoint.scheme, endpoint.hostname, endpoint.port) == ("http", "127.0.0.1", config.port)
    ui_port = next(host for host, container in _port_pairs(services["temporal-ui"]) if container == "8080")
    assert {f"http://localhost:{ui_port}", f"http://127.0.0.1:{ui_port}"} <= set(config.origins)


# -- the Dockerfile -------------------------------------------------------------------------


def _instructions() -> list[tuple[str, str]]:
    text = DOCKERFILE.read_text().replace("\\\n", " ")
    out = []
    for line in text.splitlines():
        line = line.strip()
        if line and not line.startswith("#"):
            keyword, _, rest = line.partition(" ")
            out.append((keyword.upper(), rest.strip()))
    return out


def test_every_file_the_dockerfile_copies_exists() -> None:
    copies = [rest for keyword, rest in _instructions() if keyword in ("COPY", "ADD")]
    assert copies
    for rest in copies:
        args = [a for a in shlex.split(rest) if not a.startswith("--")]
        for source in args[:-1]:
            assert (ROOT / source).exists(), (
                f"the Dockerfile copies {source!r}, which is not in the repository"
            )


def test_the_image_holds_every_package_the_project_installs() -> None:
    """`pip install .` in the image finds every directory setuptools maps into `turnkeeper`."""
    copied = {
        name
        for keyword, rest in _instructions()
        if keyword == "COPY"
        for name in shlex.split(rest)[:-1]
        if not name.startswith("--")
    }
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    for package, directory in setuptools["package-dir"].items():
        assert directory in copied, f"{directory}/ ({package}) is not copied into the image"
    assert "README.md" in copied and "pyproject.toml" in copied  # readme = "README.md"
    cmd = [rest for keyword, rest in _instructions() if keyword == "CMD"][-1]
    # The installed console script: a checkout's turnkeeper/ in the working directory
    # lacks the mapped subpackages and must not shadow the installed package.
    assert json.loads(cmd) == ["turnkeeper", "worker"]


def test_the_web_page_runs_beside_the_workers_with_a_token(services: dict[str, dict[str, Any]]) -> None:
    web = services["web"]
    assert web["command"] == ["turnkeeper", "web"]
    env = environment(web)
    assert env["TEMPORAL_ADDRESS"] == "temporal:7233" and env["TURNKEEPER_WEB_ADDRESS"] == "0.0.0.0:8000"
    # The same store as the workers, and no default token: compose refuses to start without one.
    assert env["TURNKEEPER_DATABASE_URL"] == environment(services["worker"])["TURNKEEPER_DATABASE_URL"]
    assert env["TURNKEEPER_WEB_TOKEN"].startswith("${TURNKEEPER_WEB_TOKEN:?")
    assert ("8000", "8000") in _port_pairs(web)
    # Only what `turnkeeper web` reads: Settings' variables and its own.
    known = {"TURNKEEPER_WEB_ADDRESS", "TURNKEEPER_WEB_TOKEN", "TURNKEEPER_LOG_LEVEL", *config.ENV_VARS}
    assert set(env) <= known, set(env) - known
