# The turnkeeper worker image (see docker-compose.yml). `pip install .[otel]` brings
# every dependency, asyncpg (the PostgreSQL session store) and OpenTelemetry
# (traces, with OTEL_EXPORTER_OTLP_ENDPOINT) included, as wheels.
FROM python:3.11-slim
# bubblewrap: the sandbox `exec` commands run in (TURNKEEPER_EXEC_SANDBOX=auto).
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap \
    && rm -rf /var/lib/apt/lists/*
WORKDIR /app
COPY pyproject.toml README.md ./
COPY turnkeeper ./turnkeeper
COPY workflows ./workflows
COPY activities ./activities
RUN pip install --no-cache-dir ".[otel]"
ENV TURNKEEPER_DATA_DIR=/data TURNKEEPER_WORKSPACE=/workspace
VOLUME ["/data", "/workspace"]
# SIGTERM gives running tools TURNKEEPER_SHUTDOWN_GRACE seconds to finish.
STOPSIGNAL SIGTERM
# The installed worker (`turnkeeper.worker`): the copied sources in /app are only
# what `pip install .` reads.
CMD ["turnkeeper", "worker"]
