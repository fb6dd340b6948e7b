"""What a load generator spends per request, by sender: the bench's own load generator (one worker
process, Poisson arrivals) against the real tritonserver serving the example repository's ``minilm``,
sending its gRPC requests as bytes built once (``wire``), through the project's asyncio client
(``client``), or as the HTTP client's requests built once (``http``), interleaved over ``--repeat``
rounds. Texts of ``--tokens`` tokens (default 16: on the 2-core development machine the CPU server
keeps up with chat-length texts only at a few dozen requests per second; ``--tokens 0`` draws chat
lengths). Prints, per run: the rate answered, p50/p99, and the CPU the load generator's process used
per request (psutil), with the server's for context; then the median and range per sender. Needs
``model_repository/`` (``make demo`` or ``tritonbundle repo``).

    .venv/bin/python scripts/loadgen_cost.py --rate 150 --seconds 10 --repeat 3
    .venv/bin/python scripts/loadgen_cost.py --rate 40 --seconds 15 --repeat 3 --tokens 0

``--identity`` serves a model that does next to nothing instead (16 floats back as they came, a Python
backend model batched to 64), so that the rate can be high and the server's figure is mostly its
frontend's (gRPC or HTTP) and scheduling per request:

    .venv/bin/python scripts/loadgen_cost.py --identity --rate 1000 --seconds 10 --repeat 3
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from tritonbundle.measure.loadgen import LoadPool
from tritonbundle.measure.probes import CpuMeter
from tritonbundle.measure.wire import SENDER_ENV, SENDERS
from tritonbundle.served import ServedRepository
from tritonbundle.traffic import dump, synthetic

ROOT = Path(__file__).resolve().parents[1]


def identity_repository(folder: Path, sleep_s: float = 0.0, max_batch: int = 64, instances: int = 1) -> Path:
    """A repository of one model, ``identity``: FP32 [batch, 16] back as it came, batched to ``max_batch``
    (the Python backend: the wheel's tritonserver has no other; one execute() per batch, numpy only),
    each batch held ``sleep_s`` first (requests pile up in flight, as at a GPU's knee)."""
    version = folder / "repository" / "identity" / "1"
    version.mkdir(parents=True)
    (version / "model.py").write_text(
        "import time\n\nimport triton_python_backend_utils as pb_utils\n\n\n"
        "class TritonPythonModel:\n"
        "    def execute(self, requests):\n"
        + (f"        time.sleep({sleep_s!r})\n" if sleep_s > 0 else "")
        + "        return [pb_utils.InferenceResponse([pb_utils.Tensor('y', pb_utils.get_input_tensor_by_name(r, 'x')"
        ".as_numpy())]) for r in requests]\n")
    (version.parent / "config.pbtxt").write_text(
        f'name: "identity"\nbackend: "python"\nmax_batch_size: {max_batch}\n'
        'input [ { name: "x" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
        'output [ { name: "y" data_type: TYPE_FP32 dims: [ 16 ] } ]\n'
        f'dynamic_batching {{ }}\ninstance_group [ {{ count: {instances} kind: KIND_CPU }} ]\n')
    return version.parent.parent


def cpu_per_request(before: dict[str, float], after: dict[str, float], sent: int) -> dict[str, float]:
    """CPU time per request sent (ms) of the ``load`` and ``server`` processes between two readings of a
    :class:`CpuMeter` over those two groups."""
    used = {group: sum(v - before.get(k, 0.0) for k, v in after.items() if k.startswith(group + ":"))
            for group in ("load", "server")}
    return {group: 1000.0 * cpu / max(1, sent) for group, cpu in used.items()}


def run(served: ServedRepository, folder: Path, traffic: Path, how: str, rate: float, seconds: float, seed: int,
        model: str = "minilm") -> float:
    os.environ[SENDER_ENV] = how
    with LoadPool(1, folder, how) as pool:
        pool.setup(kind="grpc", url=served.grpc_url, http_url=served.server.http_url, model=model,
                   traffic=str(traffic), seed=seed, timeout_s=10.0, pool=500)
        assert served.server.process is not None
        meter = CpuMeter({"load": pool.pids[0], "server": served.server.process.pid})
        before = meter.read()
        step = pool.step(rate, warmup_s=0.0, window_s=seconds, grace_s=5.0, seed=seed)
        after = meter.read()
    per_request = cpu_per_request(before, after, step.sent)
    print(f"{how:6s}: {step.sent / seconds:6.1f} req/s sent, {step.failed} failed, p50 {step.p50_ms:5.1f} ms, "
          f"p99 {step.p99_ms:6.1f} ms; CPU per request: load generator {per_request['load']:.3f} ms, "
          f"tritonserver and stubs {per_request['server']:.3f} ms", flush=True)
    return per_request["load"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rate", type=float, default=150.0, help="offered requests per second")
    parser.add_argument("--seconds", type=float, default=10.0, help="seconds per run")
    parser.add_argument("--repeat", type=int, default=3, help="rounds, each sender once per round")
    parser.add_argument("--tokens", type=int, default=16, help="tokens per text; 0: chat lengths")
    parser.add_argument("--identity", action="store_true", help="serve a do-nothing model instead of minilm")
    args = parser.parse_args()
    results: dict[str, list[float]] = {how: [] for how in SENDERS}
    with tempfile.TemporaryDirectory(prefix="loadgen-cost-") as tmp:
        folder = Path(tmp)
        sample = synthetic("fixed", fixed_tokens=args.tokens) if args.tokens else synthetic("chat")
        traffic = dump(sample, folder / "traffic.jsonl")
        repository, model = (identity_repository(folder), "identity") if args.identity else \
            (ROOT / "model_repository", "minilm")
        with ServedRepository(repository, folder) as served:
            served.start(180)
            for r in range(args.repeat):
                for how in SENDERS:
                    results[how].append(run(served, folder, traffic, how, args.rate, args.seconds, seed=r, model=model))
    for how, values in results.items():
        print(f"{how:6s}: load generator CPU per request, median {statistics.median(values):.3f} ms "
              f"[{min(values):.3f}-{max(values):.3f}] over {len(values)} runs")


if __name__ == "__main__":
    main()
