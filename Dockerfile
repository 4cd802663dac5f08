# The turnkeeper image: the worker by default, `turnkeeper web` and `turnkeeper
# codec-server` with another command (see docker-compose.yml, deploy/kubernetes/).
# `pip install .[otel]` brings every dependency, asyncpg (the PostgreSQL session
# store) and OpenTelemetry (traces, with OTEL_EXPORTER_OTLP_ENDPOINT) included, as wheels.
FROM python:3.11.14-slim-trixie
# bubblewrap: the sandbox `exec` commands run in (TURNKEEPER_EXEC_SANDBOX=auto).
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap \
    && rm -rf /var/lib/apt/lists/*
# The processes run as this user, never as root. A fixed uid and gid, so that
# Kubernetes' runAsUser, volume ownership and files written in the workspace agree.
RUN groupadd --gid 10001 turnkeeper \
    && useradd --uid 10001 --gid 10001 --create-home --shell /usr/sbin/nologin turnkeeper
WORKDIR /app
COPY pyproject.toml README.md ./
COPY turnkeeper ./turnkeeper
COPY workflows ./workflows
COPY activities ./activities
# Installed as root, read-only to the user.
RUN pip install --no-cache-dir ".[otel]"
# The only directories the user writes; a volume mounted here starts with this ownership.
RUN mkdir -p /data /workspace && chown 10001:10001 /data /workspace
ENV TURNKEEPER_DATA_DIR=/data TURNKEEPER_WORKSPACE=/workspace
VOLUME ["/data", "/workspace"]
USER 10001:10001
# SIGTERM gives running tools TURNKEEPER_SHUTDOWN_GRACE seconds to finish.
STOPSIGNAL SIGTERM
# The installed worker (`turnkeeper.worker`): the copied sources in /app are only
# what `pip install .` reads.
CMD ["turnkeeper", "worker"]
