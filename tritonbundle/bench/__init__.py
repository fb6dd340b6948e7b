"""``tritonbundle bench``: the serving benchmark (naive PyTorch serving vs the bundle vs the engine's
ceiling, on one GPU, on the same traffic) and the packing that carries what it needs to a GPU machine.

* :mod:`.stats`: pure bookkeeping (percentiles, SLO checks, the rate search, ratios, padding, ceiling)
* :mod:`.loadgen`: open-model load generator processes (Poisson arrivals) for gRPC and HTTP
* :mod:`.naive_server`: the baseline, a plain aiohttp server running the model one request at a time
* :mod:`.probes`: GPU name/driver/utilisation (NVML or nvidia-smi) and per-process CPU time
* :mod:`.runner`: the orchestration, phase by phase within a time budget
* :mod:`.report`: bench.json, bench.md, bench.png and the console table
* :mod:`.pack`: the trimmed tritonserver, wheels and weights for the GPU machine
"""
