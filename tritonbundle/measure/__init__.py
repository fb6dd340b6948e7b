"""The measurement core shared by ``tritonbundle loadtest``, ``tritonbundle bench`` and ``tritonbundle tune``.

* :mod:`.latency`: latency summaries (one percentile convention), load levels, the SLO gate
* :mod:`.search`: the open-model rate search (highest rate whose p99 meets the SLO)
* :mod:`.triton_metrics`: Triton's Prometheus metrics: per-model requests, batches, queue vs compute
* :mod:`.procs`: process groups: start, wait for health, stop (SIGTERM, then SIGKILL)
* :mod:`.probes`: GPU name/driver/utilisation (NVML or nvidia-smi), library versions, CPU time per process
"""
