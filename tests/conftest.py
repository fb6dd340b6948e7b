"""Shared fixtures: the exported example model, a model repository and a real tritonserver.

The export is cached in the project's build/artifacts (the same cache `make demo` uses), so a
second run costs nothing. Each test session writes its own repository in a temporary folder and
starts its own server on free loopback ports.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
#: The key of the test server's restricted APIs (repository, model control, shared memory).
API_KEY = "test-key-not-a-secret"
MANIFEST = ROOT / "build" / "models.yaml"
ARTIFACTS = ROOT / "build" / "artifacts"

os.environ.setdefault("HF_HUB_OFFLINE", "1")
# Tests import Locust's classes in-process; its gevent monkey-patching would change threading and
# sockets for every other test, so it is skipped here (real runs start Locust in its own process).
os.environ["LOCUST_SKIP_MONKEY_PATCH"] = "1"


@contextlib.contextmanager
def one_process_at_a_time(name: str) -> Iterator[None]:
    """Hold a lock on ``.cache/locks/<name>.lock`` for the block: `make test` runs the unit tests on two
    pytest-xdist workers, and each worker runs a session fixture once, so two of them writing the same
    file in the checkout (the exported model, a fetched tool) must take turns; the second finds the
    first's result and reuses it."""
    locks = ROOT / ".cache" / "locks"
    locks.mkdir(parents=True, exist_ok=True)
    with (locks / f"{name}.lock").open("w") as handle:  # closing it releases the lock
        fcntl.flock(handle, fcntl.LOCK_EX)
        yield


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    # Fast tests first: a broken unit shows up before the slow ones start.
    def rank(item: pytest.Item) -> int:
        return 2 if item.get_closest_marker("docker") else 1 if item.get_closest_marker("slow") else 0

    items.sort(key=rank)


@pytest.fixture(scope="session")
def exported_minilm() -> Path:
    """build/artifacts/minilm with model.onnx + tokenizer.json (exported once, then reused)."""
    from tritonbundle.build.stage import BuildOptions, export_all

    with one_process_at_a_time("export"):
        artifacts = export_all(BuildOptions(manifest=MANIFEST, artifacts=ARTIFACTS))
    assert artifacts["minilm"].onnx_path is not None
    return ARTIFACTS / "minilm"


@pytest.fixture(scope="session")
def default_repository(exported_minilm: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The model repository exactly as the build stage writes it from the shipped manifest."""
    from tritonbundle.build.stage import BuildOptions, build

    repo = tmp_path_factory.mktemp("default-repo") / "model_repository"
    build(BuildOptions(manifest=MANIFEST, artifacts=ARTIFACTS, repository=repo, export=False))
    return repo


@pytest.fixture(scope="session")
def repository(exported_minilm: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The repository the test server serves: the shipped manifest with a 10 s queue timeout.

    The suite runs on 2 cores next to its own load generators; the default 1 s queue timeout would
    turn that contention into rejected requests in tests that are not about overload. (The overload
    tests read the timeout from the config they test.)
    """
    from tritonbundle.build.stage import BuildOptions, build

    repo = tmp_path_factory.mktemp("repo") / "model_repository"
    build(BuildOptions(manifest=MANIFEST, artifacts=ARTIFACTS, repository=repo, export=False,
                       overrides={"queue_timeout_us": 10_000_000}))
    return repo


@pytest.fixture(scope="session")
def server(repository: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[object]:
    """A real tritonserver (the nvidia-pytriton wheel's) serving ``repository`` on free ports."""
    from tritonbundle.server import ServerOptions, TritonServer

    log = tmp_path_factory.mktemp("server") / "tritonserver.log"
    srv = TritonServer(ServerOptions(repository, http_port=0, grpc_port=0, metrics_port=0, log_path=log,
                                     restricted_api_key=API_KEY))
    srv.start(ready_timeout_s=180)
    yield srv
    srv.stop()


def token_counts(artifacts: Path, texts: list[str]) -> list[int]:
    """Each text's token count by the ``tokenizers`` library itself (truncated at 512): what the served
    tokenizer's ``tokens`` output and the gateway's usage must equal."""
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(artifacts / "tokenizer.json"))
    tok.no_padding()
    tok.enable_truncation(max_length=512)
    return [len(tok.encode(text).ids) for text in texts]


#: The user property a test records an accuracy gate's figures under (:func:`record_gate`).
GATE_FIGURES = "gate_figures"


def record_gate(request: pytest.FixtureRequest, line: str) -> None:
    """Keep a gate's figures for the end of the run: as a property of the test's report, which
    pytest-xdist carries from its workers to the run that prints the summary."""
    request.node.user_properties.append((GATE_FIGURES, line))


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print the accuracy gates' figures (cosine, max |diff|) the precision tests measured."""
    lines = [value for reports in terminalreporter.stats.values() for r in reports
             if getattr(r, "when", "") == "call" for key, value in getattr(r, "user_properties", ()) if key == GATE_FIGURES]
    if lines:
        terminalreporter.write_sep("-", "accuracy gates (ONNX Runtime, CPU)")
        for line in lines:
            terminalreporter.write_line(str(line))
