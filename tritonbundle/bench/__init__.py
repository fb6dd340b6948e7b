"""``tritonbundle bench``: the serving benchmark: naive PyTorch serving vs the bundle vs the engine's
ceiling, on one GPU, on the same traffic, in one run.

* :mod:`.options`: the settings and the time each step gets
* :mod:`.workspace`: the tokenizer, the repository the build stage writes, the servers' environment
* :mod:`.phase`: the run's context and the rate search with server-side observations
* :mod:`.naive` (+ :mod:`.naive_server`), :mod:`.bundle` (+ :mod:`.breakdown`), :mod:`.ceiling`: the systems
* :mod:`.answers`: every system's answers checked against the FP32 reference before it is measured
* :mod:`.loadgen`: open-model load generator processes (Poisson arrivals) for gRPC and HTTP
* :mod:`.accounting`: ratios, padding accounting and the ceiling arithmetic (pure)
* :mod:`.records`: what each system measured, as typed records; :mod:`.result`: each model and the run
  (``bench.json`` is their ``to_json()``; ``from_json()`` reads a report back)
* :mod:`.run`: the orchestration, phase by phase within a time budget; :mod:`.report`: its outputs

Latencies, the SLO gate and the rate search are the measurement core's (:mod:`tritonbundle.measure`).
The GPU machine's tooling (packing the server and weights it lacks) is in ``scripts/``.
"""
