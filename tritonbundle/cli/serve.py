"""``tritonbundle serve``: run tritonserver on a model repository until Ctrl-C / SIGTERM."""

from __future__ import annotations

import argparse
import json
import os
import signal
import threading
from pathlib import Path
from typing import Any

from tritonbundle.cli import args as shared
from tritonbundle.cli import defaults
from tritonbundle.log import LOG, step


def cmd_serve(args: argparse.Namespace) -> int:
    from tritonbundle.errors import ServerError
    from tritonbundle.runtimes.tensorrt import serving
    from tritonbundle.server import ServerOptions, TritonServer

    if serving.plans(args.repository):  # TensorRT plans: refuse another TensorRT's, allow version-compatible ones
        notes: list[str] = []
        problems = serving.problems(args.repository, serving.installed_version(), notes)
        for note in notes:
            LOG.warning("%s", note)
        if problems:
            raise ServerError("refusing to start: " + "; ".join(problems))

    if args.log_file is None:  # a failed start must be able to say why
        import tempfile

        args.log_file = Path(tempfile.gettempdir()) / f"tritonbundle-serve-{os.getpid()}.log"
        LOG.info("server log: %s (--log-file to choose)", args.log_file)
    key = os.environ.get(args.api_key_env) if args.api_key_env else None
    server = TritonServer(
        ServerOptions(
            model_repository=args.repository, http_port=args.http_port, grpc_port=args.grpc_port,
            metrics_port=args.metrics_port, address=args.address, log_path=args.log_file,
            model_control_mode=args.model_control_mode, load_models=args.load_model or (),
            exit_timeout_s=args.exit_timeout_s, restricted_api_key=key, log_verbose=args.log_verbose,
            tritonserver=args.tritonserver, extra_args=serving.backend_args(args.repository),
        )
    )
    stop = threading.Event()

    def _on_signal(signum: int, _frame: object) -> None:
        LOG.info("received %s: stopping tritonserver (drains in-flight requests for up to %d s)",
                 signal.Signals(signum).name, args.exit_timeout_s)
        stop.set()

    signal.signal(signal.SIGINT, _on_signal)
    signal.signal(signal.SIGTERM, _on_signal)
    step(f"starting {server.installation.description if server.installation else 'tritonserver'}")
    server.start(wait=False)
    key_files: list[Path] = []
    if not key and server.options.restricted_api_key:
        # The key made up for this start, where the client commands on this machine look for it.
        key_files = shared.write_keys(server.options.restricted_api_key, _local_addresses(server))
        LOG.info("$%s is not set: the model-repository, shared-memory, trace and logging APIs are locked with a "
                 "random key, written (readable by you only) to %s; `tritonbundle models` and `load` read it",
                 args.api_key_env, key_files[0].parent)
    try:
        return _serve(args, server, stop)
    finally:
        server.stop()  # stopped already on every path but an error's; then it ends what is left (the MPS daemon)
        for path in key_files:
            path.unlink(missing_ok=True)


def _local_addresses(server: Any) -> list[str]:
    """host:port of HTTP and gRPC as this machine's clients may spell them."""
    out = []
    for address in (server.http_url, server.grpc_url):
        host, _, port = address.rpartition(":")
        out += [address] + [f"{alias}:{port}" for alias in ("127.0.0.1", "localhost") if alias != host]
    return out


def _serve(args: argparse.Namespace, server: Any, stop: threading.Event) -> int:
    from tritonbundle.canary import Canary, served_models, server_cpu_s
    from tritonbundle.errors import ServerError
    from tritonbundle.server import quarantine_failed_version, supervise

    try:
        ready = server.wait_ready(timeout_s=args.ready_timeout_s, stop=stop)
    except ServerError as e:
        # A server that came up (its log says it started serving) and crashed before the readiness poll
        # saw it was killed by a request, not by its configuration: with --restart that is a crash. One
        # that failed on a model version whose model has another is started again without it.
        if args.restart and server.came_up():
            LOG.warning("tritonserver came up and went down before it was seen ready: %s", str(e).splitlines()[0])
        elif args.restart and quarantine_failed_version(server) is not None:
            server.start(ready_timeout_s=args.ready_timeout_s, stop=stop)
        else:
            raise
    else:
        if not ready:  # SIGTERM or Ctrl-C while the models loaded
            LOG.info("stopped before it was ready: stopping tritonserver")
            return server.stop() or 0
        LOG.info("ready: HTTP %s  gRPC %s  metrics %s%s", server.http_url, server.grpc_url, server.metrics_url,
                 f"  (log: {args.log_file})" if args.log_file else "")
        if server.mps is not None:  # TRITONBUNDLE_GPU_SHARING=mps: did the models' processes come?
            from tritonbundle.gpu_sharing import servers_words

            LOG.info("%s", servers_words(server.mps.servers()))
        if args.ready_file:
            args.ready_file.write_text(json.dumps({"http": server.http_url, "grpc": server.grpc_url,
                                                   "metrics": server.metrics_url}))
    canary = None
    if args.canary_interval_s > 0:
        canary = Canary(f"http://{server.http_url}", served_models(args.repository), timeout_s=args.canary_timeout_s,
                        metrics_url=server.metrics_url, cpu_s=lambda: server_cpu_s(server.pgid()))
    return supervise(server, restart=args.restart, max_restarts=args.max_restarts, stop_event=stop,
                     ready_timeout_s=args.ready_timeout_s, already_started=True, canary=canary,
                     canary_interval_s=args.canary_interval_s)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = shared.parser(sub, "serve", help="run tritonserver on a model repository until Ctrl-C/SIGTERM")
    p.add_argument("--repository", type=Path, default=defaults.REPOSITORY)
    p.add_argument("--address", default=defaults.ADDRESS, help="address to bind (0.0.0.0 exposes the server)")
    p.add_argument("--http-port", type=int, default=defaults.HTTP_PORT, help="0 picks a free port")
    p.add_argument("--grpc-port", type=int, default=defaults.GRPC_PORT, help="0 picks a free port")
    p.add_argument("--metrics-port", type=int, default=defaults.METRICS_PORT, help="0 picks a free port")
    p.add_argument("--log-file", type=Path, help="write the server log here")
    p.add_argument("--log-verbose", type=int, default=0)
    p.add_argument("--model-control-mode", choices=("none", "poll", "explicit"), default="none")
    p.add_argument("--load-model", action="append", help="with explicit control: load this model at start")
    p.add_argument("--exit-timeout-s", type=int, default=defaults.EXIT_TIMEOUT_S,
                   help="how long Triton drains in-flight requests on stop")
    p.add_argument("--ready-timeout-s", type=float, default=defaults.READY_TIMEOUT_S)
    p.add_argument("--restart", action="store_true", help="restart the server when it crashes (with backoff)")
    p.add_argument("--max-restarts", type=int, default=defaults.MAX_RESTARTS,
                   help="failed starts in a row (never ready) before giving up; crashes after a start do not count")
    p.add_argument("--canary-interval-s", type=float, default=defaults.CANARY_INTERVAL_S,
                   help="send every model its smallest request this often; two internal errors in a row (a dead "
                        "Python stub, which Triton 2.51 reports ready) mean down: restart (--restart) or exit non-zero. 0: off")
    p.add_argument("--canary-timeout-s", type=float, default=defaults.CANARY_TIMEOUT_S,
                   help="per canary request; a timeout counts as busy, not down")
    p.add_argument("--api-key-env", default=defaults.API_KEY_ENV,
                   help="environment variable holding the key that unlocks the repository/shared-memory APIs")
    p.add_argument("--tritonserver", help="tritonserver binary (default: $TRITONSERVER, else the nvidia-pytriton wheel's)")
    p.add_argument("--ready-file", type=Path, help="write the server's addresses as JSON here once ready")
    p.set_defaults(func=cmd_serve)
