"""`turnkeeper web`: check where it may listen, build the app, serve it.

Above turnkeeper.web.server (the configuration, and uvicorn), which the codec
server shares: that module never imports the app.
"""

from __future__ import annotations

from turnkeeper.config import Settings
from turnkeeper.web.server import WebConfig, check_exposure, run_uvicorn


def serve(settings: Settings, config: WebConfig) -> int:
    check_exposure(config)
    from turnkeeper.telemetry.exporters import check_tracing

    check_tracing(settings)  # before it listens: the first send is not the place to find out
    from turnkeeper.web.app import create_app

    app = create_app(settings, config)
    guard = "a token is required" if config.token else "no token: this machine only"
    hosted = "; a worker runs in this process" if config.worker else ""
    print(f"turnkeeper web: {config.url} ({guard}{hosted})", flush=True)
    run_uvicorn(app, config.host, config.port, config.log_level)
    return 0
