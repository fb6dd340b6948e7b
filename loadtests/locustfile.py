"""Locust entry point for running the bundle's load test by hand, with Locust's web UI:

    TRITONBUNDLE_LOADTEST='{"http_url": "127.0.0.1:8000", "grpc_url": "127.0.0.1:8001"}' \
        .venv/bin/locust -f loadtests/locustfile.py

The users, load shapes and SLO gates live in tritonbundle/loadtests/locustfile.py; prefer
`tritonbundle loadtest`, which runs them headless, bounded, and writes the report folder.
"""

from tritonbundle.loadtests.locustfile import *  # noqa: F403
