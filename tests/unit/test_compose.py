"""docker-compose.yml and the Dockerfile stay consistent with the code (no Docker needed)."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import shlex
import shutil
import subprocess
import tomllib
from pathlib import Path
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
    for name in (
        "temporal",
        "temporal-ui",
        "temporal-postgresql",
        "session-postgresql",
        "worker",
        "web",
        "prometheus",
        *JOBS,
    ):
        assert name in services, f"docker-compose.yml has no service {name!r}"
    # The server image and admin-tools' jobs, as Temporal's own compose files run it
    # (auto-setup is deprecated).
    assert _image(services["temporal"]).startswith("temporalio/server:")
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


# One-shot jobs (temporalio/admin-tools): what they prepare, and who waits for it.
JOBS = {"temporal-schema": ("temporal",), "temporal-namespace": ("temporal-ui", "worker", "web")}


def test_dependencies_wait_for_healthy_services(services: dict[str, dict[str, Any]]) -> None:
    """Every dependency has a condition: a job's is that it succeeded, any other
    service's that its health check passes."""
    for name, service in services.items():
        depends = service.get("depends_on") or {}
        assert isinstance(depends, dict), f"{name}: depends_on needs conditions, not a bare list"
        for target, spec in depends.items():
            assert target in services, f"{name} depends on unknown service {target!r}"
            if target in JOBS:
                assert spec.get("condition") == "service_completed_successfully", (
                    f"{name} -> {target}: wait until the job succeeded"
                )
            else:
                assert spec.get("condition") == "service_healthy", f"{name} -> {target}: wait until healthy"
                assert "healthcheck" in services[target], (
                    f"{target} needs a healthcheck ({name} waits for it)"
                )
    worker_deps = set(services["worker"]["depends_on"])
    assert {"temporal", "session-postgresql"} <= worker_deps
    assert "temporal-postgresql" in services["temporal"]["depends_on"]
    for job, waiting in JOBS.items():
        for name in waiting:
            assert job in services[name]["depends_on"], f"{name} must wait for {job}"


def test_every_long_running_service_has_a_healthcheck(services: dict[str, dict[str, Any]]) -> None:
    for name, service in services.items():
        if name in JOBS:
            assert str(service.get("restart")) == "no", f"{name} runs once"
            assert "healthcheck" not in service, name
        else:
            check = service.get("healthcheck") or {}
            assert check.get("test") and not check.get("disable"), f"{name} needs a healthcheck"
            assert seconds(str(check.get("interval", "30s"))) <= 30, name
            test = check["test"]
            if test[:3] == ["CMD", "python", "-c"]:
                compile(test[3], f"{name}'s healthcheck", "exec")  # a syntax error never passes


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
    if not path.startswith("/"):  # the server resolves a relative path from /etc/temporal
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


def test_temporal_is_healthy_once_its_frontend_serves(services: dict[str, dict[str, Any]]) -> None:
    temporal = services["temporal"]
    env = environment(temporal)
    # Bound to every interface: the health check asks on loopback, the others by name.
    assert env["BIND_ON_IP"] == "0.0.0.0"
    test = temporal["healthcheck"]["test"]
    assert test[0] == "CMD" and test[1] == "wget", "the server image has busybox's wget, no temporal CLI"
    url = urlsplit(test[-1])
    assert (url.hostname, url.port, url.path) == ("127.0.0.1", 7243, "/api/v1/system-info")
    assert ("7243", "7243") in _port_pairs(temporal)


def _job_script(services: dict[str, dict[str, Any]], job: str) -> Path:
    """The script a job runs: mounted read-only from deploy/temporal/, run by sh."""
    service = services[job]
    assert _image(service) == _image(services["temporal"]).replace("/server:", "/admin-tools:"), (
        f"{job}: admin-tools of the server's version"
    )
    command = service["command"]
    assert command[0] == "sh" and len(command) == 2, command
    host = _mounts(service)[command[1]]
    assert str(service["volumes"][0]).endswith(":ro")
    path = (ROOT / host).resolve()
    assert path.parent == ROOT / "deploy" / "temporal" and path.is_file(), path
    sh = shutil.which("sh")
    if sh:  # the syntax, as a POSIX shell reads it
        subprocess.run([sh, "-n", str(path)], check=True)
    return path


def test_the_schema_job_gates_the_server(services: dict[str, dict[str, Any]]) -> None:
    """temporal-schema creates or migrates Temporal's databases, on the server's own
    PostgreSQL with its credentials, before the server starts."""
    script = _job_script(services, "temporal-schema").read_text()
    env = environment(services["temporal-schema"])
    server = environment(services["temporal"])
    assert (env["SQL_PLUGIN"], env["SQL_HOST"], env["SQL_PORT"]) == (
        server["DB"],
        server["POSTGRES_SEEDS"],
        server["DB_PORT"],
    )
    assert (env["SQL_USER"], env["SQL_PASSWORD"]) == (server["POSTGRES_USER"], server["POSTGRES_PWD"])
    for database, schema in (("temporal", "temporal"), ("temporal_visibility", "visibility")):
        assert f"migrate {database} {schema}" in script
    for step in ("create-database", "setup-schema", "update-schema"):
        assert step in script
    assert "set -eu" in script  # a failed step fails the job, and the server does not start
    depends = services["temporal"]["depends_on"]
    assert depends["temporal-schema"]["condition"] == "service_completed_successfully"


def test_the_namespace_job_registers_the_search_attributes(
    services: dict[str, dict[str, Any]], worker_env: dict[str, str]
) -> None:
    """temporal-namespace creates the workers' namespace and registers the contract's
    search attributes, all Keyword, once the server is healthy."""
    from turnkeeper.statuses import SEARCH_ATTRIBUTE_NAMES

    job = services["temporal-namespace"]
    script = _job_script(services, "temporal-namespace").read_text()
    env = environment(job)
    assert env["TEMPORAL_ADDRESS"] == worker_env["TEMPORAL_ADDRESS"]
    assert env["TEMPORAL_NAMESPACE"] == worker_env["TEMPORAL_NAMESPACE"]
    assert job["environment"]["TEMPORAL_NAMESPACE"] == services["worker"]["environment"]["TEMPORAL_NAMESPACE"]
    assert job["depends_on"]["temporal"]["condition"] == "service_healthy"
    assert "temporal operator namespace create" in script
    registered = dict(re.findall(r"--name (\w+) --type (\w+)", script))
    assert registered == dict.fromkeys(SEARCH_ATTRIBUTE_NAMES, "Keyword")


# -- the worker -----------------------------------------------------------------------------


def test_each_variable_is_read_by_one_field_and_matters() -> None:
    """`config.ENV_VARS` are `Settings`' variables: each read once, and each, set alone,
    changes the settings."""
    assert len(config.ENV_VARS) == len(set(config.ENV_VARS))
    key = "k1:" + "A" * 43 + "="
    profile = '{"p": {"instructions": "i", "tools": []}}'
    values = (
        "value-x",
        "4242",
        "on",
        "off",
        "asyncio",
        "debug",
        "127.0.0.1:4242",
        "http://x.example",
        key,
        profile,
    )
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
    own = {"temporal_address", "data_dir", "database_url", "workspace", "metrics_address"}
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


def test_every_process_that_talks_to_temporal_has_the_keys(services: dict[str, dict[str, Any]]) -> None:
    """The page sends messages and reads state as the workers do: the same keys, as written."""
    keys = "TURNKEEPER_ENCRYPTION_KEYS"
    written = {name: services[name]["environment"].get(keys) for name in ("worker", "web", "codec-server")}
    assert len(set(written.values())) == 1 and None not in written.values(), written


def test_no_stray_settings(services: dict[str, dict[str, Any]]) -> None:
    """The UI gets what it uses: its server, its namespace and the codec endpoint
    (the page's origin is the codec server's to allow, not the UI's)."""
    for name, service in services.items():
        assert "TEMPORAL_CORS_ORIGINS" not in environment(service), name
    ui = environment(services["temporal-ui"])
    assert set(ui) == {"TEMPORAL_ADDRESS", "TEMPORAL_DEFAULT_NAMESPACE", "TEMPORAL_CODEC_ENDPOINT"}
    assert ui["TEMPORAL_DEFAULT_NAMESPACE"] == environment(services["worker"])["TEMPORAL_NAMESPACE"]


# -- metrics --------------------------------------------------------------------------------


def test_worker_metrics_are_scraped_and_its_health_read_from_them(
    services: dict[str, dict[str, Any]], worker_env: dict[str, str]
) -> None:
    """Every worker serves /metrics on the compose network; its health check reads
    that endpoint, and prometheus scrapes every replica on the same port."""
    settings = Settings.from_env(worker_env)
    assert settings.metrics_address is not None, "the stack's workers serve metrics"
    host, _, port = settings.metrics_address.rpartition(":")
    assert host == "0.0.0.0"  # reachable from prometheus, not only on the container's loopback
    worker = services["worker"]
    assert [str(p) for p in worker.get("expose", [])] == [port]
    probe = " ".join(worker["healthcheck"]["test"])
    assert f"http://127.0.0.1:{port}/metrics" in probe and "temporal_worker_start" in probe

    prometheus = services["prometheus"]
    assert _image(prometheus).startswith("prom/prometheus:v")
    mounts = _mounts(prometheus)
    config_file = ROOT / mounts["/etc/prometheus/prometheus.yml"]
    assert config_file.resolve() == ROOT / "deploy" / "prometheus" / "prometheus.yml"
    assert ("9090", "9090") in _port_pairs(prometheus)
    assert all(str(p).startswith("127.0.0.1:") for p in prometheus["ports"])  # loopback only

    scrape = {job["job_name"]: job for job in yaml.safe_load(config_file.read_text())["scrape_configs"]}
    # Every replica: the service name answers with each one's address.
    [discovery] = scrape["turnkeeper-worker"]["dns_sd_configs"]
    assert discovery["names"] == ["worker"] and discovery["type"] == "A"
    assert str(discovery["port"]) == port
    assert scrape["turnkeeper-worker"].get("metrics_path", "/metrics") == "/metrics"
    # The server's own metrics, where it serves them.
    server_metrics = environment(services["temporal"])["PROMETHEUS_ENDPOINT"]
    [targets] = scrape["temporal-server"]["static_configs"]
    assert targets["targets"] == [f"temporal:{server_metrics.rpartition(':')[2]}"]


# -- the image's user -----------------------------------------------------------------------


def test_the_image_runs_as_a_fixed_non_root_user() -> None:
    """USER is a fixed numeric uid:gid other than root's, set after the last RUN, and it
    owns the directories the processes write (the data dir and the workspace)."""
    instructions = _instructions()
    users = [i for i, (keyword, _) in enumerate(instructions) if keyword == "USER"]
    assert users, "the Dockerfile sets no USER: the processes would run as root"
    last_user = users[-1]
    uid, _, gid = instructions[last_user][1].partition(":")
    assert uid.isdigit() and gid.isdigit(), "numeric, so Kubernetes' runAsNonRoot can check it"
    assert int(uid) != 0 and int(gid) != 0
    runs = [i for i, (keyword, _) in enumerate(instructions) if keyword == "RUN"]
    assert max(runs) < last_user, "nothing runs as root after USER"
    env = " ".join(rest for keyword, rest in instructions if keyword == "ENV")
    data_dir = re.search(r"TURNKEEPER_DATA_DIR=(\S+)", env)
    workspace = re.search(r"TURNKEEPER_WORKSPACE=(\S+)", env)
    assert data_dir and workspace
    chowned = [
        rest.split("chown", 1)[1].split()
        for keyword, rest in instructions
        if keyword == "RUN" and "chown" in rest
    ]
    for directory in (data_dir.group(1), workspace.group(1)):
        assert any(args[0] == f"{uid}:{gid}" and directory in args for args in chowned), (
            f"{directory} is not the user's: the worker could not write it"
        )
