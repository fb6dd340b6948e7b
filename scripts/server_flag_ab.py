"""tritonserver's CPU per request with and without one of its flags, interleaved: the real tritonserver
serving ``identity`` (``scripts/loadgen_cost.py``: 16 floats back as they came, batched to 256, two
instances, each batch held ``--sleep-ms`` first so that requests pile up in flight as they do at a GPU's
knee), driven by the bench's own load generator (one process, Poisson arrivals, the sender named by
``--sender``) at ``--rate`` for ``--seconds`` after a 3-s warm-up, ``--rounds`` times each. Prints each
run (rate, p50/p99, CPU per request of tritonserver with its stubs and of the load generator) and the
median and range per setting.

    .venv/bin/python scripts/server_flag_ab.py --flag=--grpc-infer-allocation-pool-size=2048 --sleep-ms 40 --rate 800
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
from pathlib import Path

from loadgen_cost import cpu_per_request, identity_repository

from tritonbundle.measure.loadgen import LoadPool
from tritonbundle.measure.probes import CpuMeter
from tritonbundle.measure.wire import SENDER_ENV, SENDERS
from tritonbundle.served import ServedRepository
from tritonbundle.traffic import dump, synthetic


def measure(repository: Path, folder: Path, traffic: Path, flags: list[str], rate: float, seconds: float,
            seed: int) -> dict[str, float]:
    """One run: CPU per answered request (ms) of the server's processes and of the load generator."""
    with ServedRepository(repository, folder, extra_args=flags) as served:
        served.start(120)
        assert served.server.process is not None
        with LoadPool(1, folder, "flag-ab") as pool:
            pool.setup(kind="grpc", url=served.grpc_url, http_url=served.server.http_url, model="identity",
                       traffic=str(traffic), seed=seed, timeout_s=10.0, pool=500)
            meter = CpuMeter({"load": pool.pids[0], "server": served.server.process.pid})
            pool.step(rate, warmup_s=0.0, window_s=3.0, grace_s=3.0, seed=seed)
            before = meter.read()
            step = pool.step(rate, warmup_s=0.0, window_s=seconds, grace_s=5.0, seed=seed)
            after = meter.read()
    per = cpu_per_request(before, after, step.sent)
    print(f"{' '.join(flags) or 'default':50s}: {step.sent / seconds:6.0f} req/s, {step.failed} failed, p50 "
          f"{step.p50_ms:5.1f} ms, p99 {step.p99_ms:5.1f} ms; CPU per request: server {per['server']:.3f} ms, "
          f"load generator {per['load']:.3f} ms", flush=True)
    return per


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--flag", required=True, help="the tritonserver flag to compare with its default")
    parser.add_argument("--sleep-ms", type=float, default=40.0, help="each batch held this long")
    parser.add_argument("--rate", type=float, default=800.0, help="offered requests per second")
    parser.add_argument("--seconds", type=float, default=10.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--sender", choices=SENDERS, default="wire")
    args = parser.parse_args()
    os.environ[SENDER_ENV] = args.sender
    settings = {"default": [], args.flag: [args.flag]}
    server: dict[str, list[float]] = {name: [] for name in settings}
    with tempfile.TemporaryDirectory(prefix="server-flag-ab-") as tmp:
        folder = Path(tmp)
        traffic = dump(synthetic("fixed", fixed_tokens=16), folder / "traffic.jsonl")
        repository = identity_repository(folder, args.sleep_ms / 1000.0, max_batch=256, instances=2)
        for r in range(args.rounds):
            for name, flags in settings.items():
                run = folder / f"run-{r}-{len(server[name])}-{'flag' if flags else 'default'}"
                server[name].append(measure(repository, run, traffic, flags, args.rate, args.seconds, r)["server"])
    for name, values in server.items():
        print(f"{name}: tritonserver CPU per request, median {statistics.median(values):.3f} ms "
              f"[{min(values):.3f}-{max(values):.3f}] over {len(values)} runs")


if __name__ == "__main__":
    main()
