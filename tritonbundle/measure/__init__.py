"""The measurement core shared by ``tritonbundle loadtest``, ``tritonbundle bench`` and ``tritonbundle tune``.

* :mod:`.latency`: latency summaries (one percentile convention), load levels, the SLO gate
* :mod:`.search`: the open-model rate search (highest rate whose p99 meets the SLO)
* :mod:`.triton_metrics`: Triton's Prometheus metrics: per-model requests, batches, queue vs compute
* (process groups: start, wait for health, stop: :mod:`tritonbundle.proc`, one layer down)
* :mod:`.probes`: GPU name/driver/utilisation (NVML or nvidia-smi), library versions, CPU time per process
* :mod:`.loadgen`: the open-model load generator: worker processes that fire requests on a Poisson
  schedule over gRPC/HTTP and report latencies per level
"""
