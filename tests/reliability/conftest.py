"""Shared by the reliability tests: a CPU server with explicit model control, and a load test run beside a
case."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import API_KEY


@pytest.fixture(scope="module")
def explicit_server(exported_minilm: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Any, Path]]:
    """The shipped manifest built into a fresh repository, served with explicit model control and the
    restricted-API key (one server per test module)."""
    from tests.conftest import ARTIFACTS, MANIFEST
    from tritonbundle.build.stage import BuildOptions, build
    from tritonbundle.server import ServerOptions, TritonServer

    # A long queue timeout: on a busy 2-core machine the reload itself slows serving, and overload
    # rejections (tested elsewhere) must not be mistaken for requests dropped by the reload.
    repo = tmp_path_factory.mktemp("explicit") / "model_repository"
    build(BuildOptions(manifest=MANIFEST, artifacts=ARTIFACTS, repository=repo, export=False,
                       overrides={"queue_timeout_us": 20_000_000}))
    server = TritonServer(ServerOptions(repo, http_port=0, grpc_port=0, metrics_port=0, log_path=repo.parent / "log",
                                        model_control_mode="explicit", load_models=("*",), restricted_api_key=API_KEY))
    server.start(ready_timeout_s=120)
    yield server, repo
    server.stop()


@contextmanager
def load_test(server: Any, report_dir: Path, duration_s: float, retries: int,
              stop_after_block_s: float | None = None) -> Iterator[dict[str, Any]]:
    """A 4-user load test against ``server`` in a thread for ``duration_s`` (or, with
    ``stop_after_block_s``, until that long after the block ends); after the block, the dict holds its
    ``summary`` and ``block_s``, how long the block ran."""
    from tritonbundle.loadtests import runner
    from tritonbundle.loadtests.settings import LoadSettings
    from tritonbundle.measure.latency import Slo

    settings = LoadSettings(http_url=server.http_url, grpc_url=server.grpc_url, users=4, duration_s=duration_s,
                            retries=retries, report_dir=str(report_dir), slo=Slo(max_failure_ratio=0.0))
    outcome: dict[str, Any] = {}
    stop = threading.Event()
    load = threading.Thread(target=lambda: outcome.update(result=runner.run(settings, stop)))
    load.start()
    started = time.monotonic()
    try:
        yield outcome
    finally:
        outcome["block_s"] = time.monotonic() - started
        if stop_after_block_s is not None:
            time.sleep(stop_after_block_s)
            stop.set()
        load.join(timeout=180)
        outcome["summary"] = outcome["result"].summary
