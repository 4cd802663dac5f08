"""deploy/kubernetes/ and deploy/cloud/ stay consistent with the code and the image
(no cluster needed): every variable they set is one the processes read, secrets
come from the Secret, the probes ask what the processes serve."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support import ROOT
from turnkeeper import config
from turnkeeper.config import Settings

KUBERNETES = ROOT / "deploy" / "kubernetes"
CLOUD = ROOT / "deploy" / "cloud"
DOCKERFILE = ROOT / "Dockerfile"

# Never a literal value in a manifest: a secretKeyRef always.
SECRETS = {
    "TURNKEEPER_DATABASE_URL",
    "TURNKEEPER_ENCRYPTION_KEYS",
    "OPENAI_API_KEY",
    "TURNKEEPER_WEB_TOKEN",
    "TEMPORAL_API_KEY",
    "TURNKEEPER_CODEC_TOKEN",
}


def _read_by_the_worker() -> set[str]:
    """What a worker reads: its settings, Temporal's connection variables and, where
    the settings keep them apart, the worker's own."""
    names = set(config.ENV_VARS) | set(config.TEMPORAL_CONNECTION_ENV_VARS)
    return names | set(getattr(config, "WORKER_ENV_VARS", ()))


def _read_by_the_code() -> set[str]:
    """Every variable any process reads: the settings' names, and the names the
    code spells out (`turnkeeper web`'s own, where the settings do not list them)."""
    names = _read_by_the_worker() | set(getattr(config, "CLI_ONLY_ENV_VARS", ()))
    for folder in ("turnkeeper", "activities", "workflows"):
        for path in (ROOT / folder).rglob("*.py"):
            names |= set(re.findall(r"[\"'](TURNKEEPER_[A-Z0-9_]*[A-Z0-9])[\"']", path.read_text()))
    return names


def env_file(path: Path) -> dict[str, str | None]:
    """KEY=value lines (None: a name alone, which `docker run --env-file` and
    `kubectl --from-env-file` take from the calling environment); # comments."""
    out: dict[str, str | None] = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        name, sep, value = line.partition("=")
        assert re.fullmatch(r"[A-Z][A-Z0-9_]*", name), f"{path.name}: not a variable: {line!r}"
        assert not value.startswith(('"', "'")), f"{path.name}: {name}: no quotes, they would be kept"
        out[name] = value if sep else None
    return out


# -- Kubernetes -----------------------------------------------------------------------------


@pytest.fixture(scope="module")
def kustomization() -> dict[str, Any]:
    return yaml.safe_load((KUBERNETES / "kustomization.yaml").read_text())


@pytest.fixture(scope="module")
def objects(kustomization: dict[str, Any]) -> dict[tuple[str, str], dict[str, Any]]:
    """(kind, name) -> object, of every resource the kustomization lists."""
    out = {}
    for resource in kustomization["resources"]:
        for doc in yaml.safe_load_all((KUBERNETES / resource).read_text()):
            out[(doc["kind"], doc["metadata"]["name"])] = doc
    return out


def _pod(objects: dict[tuple[str, str], dict[str, Any]], name: str) -> dict[str, Any]:
    return objects[("Deployment", name)]["spec"]["template"]["spec"]


def _container(objects: dict[tuple[str, str], dict[str, Any]], name: str) -> dict[str, Any]:
    [container] = _pod(objects, name)["containers"]
    return container


def _literal_env(objects: dict[tuple[str, str], dict[str, Any]], name: str) -> dict[str, str]:
    """The variables a container gets with a value: its ConfigMaps, then its own."""
    container = _container(objects, name)
    env: dict[str, str] = {}
    for source in container.get("envFrom", []):
        env.update(objects[("ConfigMap", source["configMapRef"]["name"])]["data"])
    env.update({e["name"]: str(e["value"]) for e in container.get("env", []) if "value" in e})
    return env


def _dockerfile_env() -> dict[str, str]:
    text = DOCKERFILE.read_text()
    return dict(re.findall(r"(TURNKEEPER_[A-Z_]+)=(\S+)", " ".join(re.findall(r"^ENV (.*)$", text, re.M))))


def _dockerfile_user() -> tuple[int, int]:
    uid, gid = re.findall(r"^USER (\d+):(\d+)$", DOCKERFILE.read_text(), re.M)[-1]
    return int(uid), int(gid)


def test_the_kustomization_lists_every_manifest_and_pins_the_image(
    kustomization: dict[str, Any], objects: dict[tuple[str, str], dict[str, Any]]
) -> None:
    listed = set(kustomization["resources"])
    on_disk = {p.name for p in KUBERNETES.glob("*.yaml")} - {"kustomization.yaml"}
    assert listed == on_disk
    [image] = kustomization["images"]
    assert image["newTag"] and image["newTag"] != "latest"
    for name in ("turnkeeper-worker", "turnkeeper-web"):
        assert _container(objects, name)["image"] == image["name"], "the image kustomize sets"
    assert ("Service", "turnkeeper-web") in objects


def test_the_secret_is_generated_from_a_file_kept_out_of_git(kustomization: dict[str, Any]) -> None:
    [generator] = kustomization["secretGenerator"]
    assert generator["name"] == "turnkeeper-secrets" and generator["envs"] == ["secrets.env"]
    assert "secrets.env" in (KUBERNETES / ".gitignore").read_text().split()
    example = env_file(KUBERNETES / "secrets.env.example")
    # The encryption keys, the model's key, the store's URL (a password) and the page's token.
    assert set(example) == {
        "TURNKEEPER_DATABASE_URL",
        "TURNKEEPER_ENCRYPTION_KEYS",
        "OPENAI_API_KEY",
        "TURNKEEPER_WEB_TOKEN",
    }
    assert set(example) <= SECRETS
    # Set even empty, TEMPORAL_API_KEY turns TLS on: only commented out.
    assert re.search(r"^# TEMPORAL_API_KEY=", (KUBERNETES / "secrets.env.example").read_text(), re.M)


def test_secrets_come_from_the_secret(
    kustomization: dict[str, Any], objects: dict[tuple[str, str], dict[str, Any]]
) -> None:
    secret = kustomization["secretGenerator"][0]["name"]
    present = set(env_file(KUBERNETES / "secrets.env.example"))
    for (kind, _name), obj in objects.items():
        if kind == "ConfigMap":
            assert not set(obj["data"]) & SECRETS, f"a secret in ConfigMap {_name}"
    for name in ("turnkeeper-worker", "turnkeeper-web"):
        for env in _container(objects, name).get("env", []):
            if env["name"] in SECRETS:
                assert "value" not in env, f"{name}: {env['name']} as a literal"
                ref = env["valueFrom"]["secretKeyRef"]
                assert ref["name"] == secret and ref["key"] == env["name"], (name, ref)
                # A key the example leaves out must be optional, or the pod would not start.
                assert ref["key"] in present or ref.get("optional") is True, (name, ref)
    worker = {e["name"]: e for e in _container(objects, "turnkeeper-worker")["env"]}
    web = {e["name"]: e for e in _container(objects, "turnkeeper-web")["env"]}
    for name in ("TURNKEEPER_ENCRYPTION_KEYS", "OPENAI_API_KEY", "TURNKEEPER_DATABASE_URL"):
        assert "valueFrom" in worker[name], name
    # The page sends and reads as the workers do: the same keys, the same store.
    for name in ("TURNKEEPER_ENCRYPTION_KEYS", "TURNKEEPER_DATABASE_URL", "TURNKEEPER_WEB_TOKEN"):
        assert "valueFrom" in web[name], name
    assert web["TURNKEEPER_ENCRYPTION_KEYS"] == worker["TURNKEEPER_ENCRYPTION_KEYS"]


def test_every_variable_set_is_read(objects: dict[tuple[str, str], dict[str, Any]]) -> None:
    worker_names = set(_literal_env(objects, "turnkeeper-worker")) | {
        e["name"] for e in _container(objects, "turnkeeper-worker")["env"]
    }
    assert not worker_names - _read_by_the_worker(), worker_names - _read_by_the_worker()
    assert not worker_names & set(config.DEV_SERVER_ENV_VARS), "no dev server in a cluster"
    web_names = set(_literal_env(objects, "turnkeeper-web")) | {
        e["name"] for e in _container(objects, "turnkeeper-web")["env"]
    }
    assert not web_names - _read_by_the_code(), web_names - _read_by_the_code()


def test_the_worker_settings_parse_and_match_the_pod(objects: dict[tuple[str, str], dict[str, Any]]) -> None:
    env = {**_dockerfile_env(), **_literal_env(objects, "turnkeeper-worker")}
    settings = Settings.from_env(env)  # ConfigError if a value does not parse
    assert settings.temporal_address and settings.metrics_address
    pod, container = _pod(objects, "turnkeeper-worker"), _container(objects, "turnkeeper-worker")
    # Running tools get TURNKEEPER_SHUTDOWN_GRACE after SIGTERM; the kubelet waits longer.
    assert pod["terminationGracePeriodSeconds"] > settings.shutdown_grace
    # The directories the worker writes are volumes (the root filesystem is read-only).
    mounts = {m["mountPath"]: m["name"] for m in container["volumeMounts"]}
    volumes = {v["name"]: v for v in pod["volumes"]}
    assert container["securityContext"]["readOnlyRootFilesystem"] is True
    assert str(settings.workspace) in mounts and str(settings.data_dir) in mounts and "/tmp" in mounts
    claim = volumes[mounts[str(settings.workspace)]]["persistentVolumeClaim"]["claimName"]
    pvc = objects[("PersistentVolumeClaim", claim)]
    assert pvc["spec"]["accessModes"] == ["ReadWriteMany"], "every worker sees the same workspace"
    assert int(objects[("Deployment", "turnkeeper-worker")]["spec"]["replicas"]) >= 2


def test_the_pods_run_as_the_images_user(objects: dict[tuple[str, str], dict[str, Any]]) -> None:
    uid, gid = _dockerfile_user()
    for name in ("turnkeeper-worker", "turnkeeper-web"):
        pod = _pod(objects, name)
        security = pod["securityContext"]
        assert security["runAsNonRoot"] is True
        assert (security["runAsUser"], security["runAsGroup"]) == (uid, gid)
        container = _container(objects, name)["securityContext"]
        assert container["allowPrivilegeEscalation"] is False
        assert container["capabilities"]["drop"] == ["ALL"]
    assert _pod(objects, "turnkeeper-worker")["securityContext"]["fsGroup"] == gid  # the workspace


def _probe_port(container: dict[str, Any], port: int | str) -> int:
    ports = {p["name"]: p["containerPort"] for p in container["ports"]}
    return ports[port] if isinstance(port, str) else port


def test_every_container_has_probes_and_resources(objects: dict[tuple[str, str], dict[str, Any]]) -> None:
    for name in ("turnkeeper-worker", "turnkeeper-web"):
        container = _container(objects, name)
        assert container["readinessProbe"] and container["livenessProbe"], name
        resources = container["resources"]
        assert {"cpu", "memory"} <= set(resources["requests"]) and "memory" in resources["limits"], name


def test_the_worker_probes_read_its_metrics_endpoint(objects: dict[tuple[str, str], dict[str, Any]]) -> None:
    """Ready once the worker serves its task queue (the SDK's worker start on the
    metrics endpoint); alive while the endpoint answers."""
    settings = Settings.from_env(_literal_env(objects, "turnkeeper-worker"))
    assert settings.metrics_address is not None
    host, _, port = settings.metrics_address.rpartition(":")
    assert host == "0.0.0.0"  # the kubelet and Prometheus reach it on the pod's address
    container = _container(objects, "turnkeeper-worker")
    assert {p["name"]: p["containerPort"] for p in container["ports"]}["metrics"] == int(port)
    readiness = container["readinessProbe"]["exec"]["command"]
    assert readiness[:2] == ["python", "-c"]
    compile(readiness[2], "readinessProbe", "exec")
    assert f"http://127.0.0.1:{port}/metrics" in readiness[2] and "temporal_worker_start" in readiness[2]
    liveness = container["livenessProbe"]["httpGet"]
    assert liveness["path"] == "/metrics" and _probe_port(container, liveness["port"]) == int(port)
    annotations = objects[("Deployment", "turnkeeper-worker")]["spec"]["template"]["metadata"]["annotations"]
    assert annotations["prometheus.io/scrape"] == "true" and annotations["prometheus.io/port"] == port


def test_the_web_probes_and_service(objects: dict[tuple[str, str], dict[str, Any]]) -> None:
    container = _container(objects, "turnkeeper-web")
    assert container["command"] == ["turnkeeper", "web"]
    address = _literal_env(objects, "turnkeeper-web")["TURNKEEPER_WEB_ADDRESS"]
    host, _, port = address.rpartition(":")
    assert host == "0.0.0.0"
    # Ready while Temporal and the store answer (/healthz, no token needed); alive on the page.
    readiness, liveness = container["readinessProbe"]["httpGet"], container["livenessProbe"]["httpGet"]
    assert readiness["path"] == "/healthz" and liveness["path"] == "/"
    for probe in (readiness, liveness):
        assert _probe_port(container, probe["port"]) == int(port)
    service = objects[("Service", "turnkeeper-web")]["spec"]
    labels = objects[("Deployment", "turnkeeper-web")]["spec"]["template"]["metadata"]["labels"]
    assert service["selector"].items() <= labels.items()
    [service_port] = service["ports"]
    assert _probe_port(container, service_port["targetPort"]) == int(port)
    for name in ("turnkeeper-worker", "turnkeeper-web"):
        deployment = objects[("Deployment", name)]["spec"]
        assert (
            deployment["selector"]["matchLabels"].items()
            <= deployment["template"]["metadata"]["labels"].items()
        )


# -- Temporal Cloud -------------------------------------------------------------------------


def _cloud(name: str) -> dict[str, str | None]:
    variables = env_file(CLOUD / name)
    # Names the settings read, or temporalio.envconfig reads for them: a rename breaks this.
    unknown = set(variables) - set(config.ENV_VARS) - set(config.TEMPORAL_CONNECTION_ENV_VARS)
    assert not unknown, f"{name}: nothing reads {sorted(unknown)}"
    # The worker's files: the CLI's HTTP address is the operator's to add (docs/operations.md).
    assert "TURNKEEPER_TEMPORAL_HTTP_ADDRESS" not in variables
    assert re.fullmatch(r"<namespace>\.<account-id>", variables["TEMPORAL_NAMESPACE"] or "")
    return variables


def _connect_config(variables: dict[str, str | None], **given: str) -> dict[str, Any]:
    from temporalio.envconfig import ClientConfig

    env = {k: v for k, v in variables.items() if v is not None} | given
    return dict(ClientConfig.load_client_connect_config(disable_file=True, override_env_vars=env))


def test_the_cloud_api_key_example() -> None:
    variables = _cloud("api-key.env")
    assert variables["TEMPORAL_ADDRESS"] == "<region>.<cloud>.api.temporal.io:7233"
    # The key is never written in the file: taken from the environment it runs in.
    assert "TEMPORAL_API_KEY" in variables and variables["TEMPORAL_API_KEY"] is None
    assert not any(name.startswith("TEMPORAL_TLS") for name in variables)
    connect = _connect_config(variables, TEMPORAL_API_KEY="a-key")
    assert connect["api_key"] == "a-key" and connect["tls"] is True
    assert connect["namespace"] == variables["TEMPORAL_NAMESPACE"]
    settings = Settings.from_env({k: v for k, v in variables.items() if v is not None})
    assert settings.temporal_address == variables["TEMPORAL_ADDRESS"]


def test_the_cloud_mtls_example(tmp_path: Path, objects: dict[tuple[str, str], dict[str, Any]]) -> None:
    variables = _cloud("mtls.env")
    assert variables["TEMPORAL_ADDRESS"] == "<namespace>.<account-id>.tmprl.cloud:7233"
    assert "TEMPORAL_API_KEY" not in variables
    cert, key = variables["TEMPORAL_TLS_CLIENT_CERT_PATH"], variables["TEMPORAL_TLS_CLIENT_KEY_PATH"]
    assert cert and key
    # Where the Kubernetes example mounts the Secret `kubectl create secret tls` makes.
    directory = str(Path(cert).parent)
    assert str(Path(key).parent) == directory
    assert (Path(cert).name, Path(key).name) == ("tls.crt", "tls.key")
    for name in ("turnkeeper-worker", "turnkeeper-web"):
        pod, container = _pod(objects, name), _container(objects, name)
        mount = next(m for m in container["volumeMounts"] if m["mountPath"] == directory)
        volume = next(v for v in pod["volumes"] if v["name"] == mount["name"])
        assert volume["secret"]["optional"] is True, "a cluster without mTLS starts without it"
    # The variables turn TLS on with that certificate (files of our own stand in for them).
    (tmp_path / "tls.crt").write_text("cert")
    (tmp_path / "tls.key").write_text("key")
    local = variables | {
        "TEMPORAL_TLS_CLIENT_CERT_PATH": str(tmp_path / "tls.crt"),
        "TEMPORAL_TLS_CLIENT_KEY_PATH": str(tmp_path / "tls.key"),
    }
    tls = _connect_config(local)["tls"]
    assert (tls.client_cert, tls.client_private_key) == (b"cert", b"key")
