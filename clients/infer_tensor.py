"""Call a tensor model (your own ONNX graph, served as it is) with numpy arrays over HTTP and gRPC.

The arrays here are random data of the shapes the model declares (a dynamic axis gets 2 rows for the
batch, 8 elsewhere); send your own the same way: ``client.infer({"input name": array, ...})``.

Run a server with a tensor model first (`.venv/bin/tritonbundle init model.onnx`, `build`, `serve`), then:
`.venv/bin/python clients/infer_tensor.py MODEL [HTTP_URL] [GRPC_URL]`
"""

from __future__ import annotations

import sys
from typing import Any

import numpy as np
from tritonclient.utils import triton_to_np_dtype

from tritonbundle.clients import GrpcClient, HttpClient, ModelInfo


def random_inputs(info: ModelInfo, batch: int = 2) -> dict[str, np.ndarray[Any, Any]]:
    """One array per input, of its declared data type and shape."""
    rng = np.random.default_rng(0)
    arrays = {}
    for i, t in enumerate(info.inputs):
        shape = [batch if (d < 0 and k == 0) else 8 if d < 0 else d for k, d in enumerate(t.shape)]
        dtype = triton_to_np_dtype(t.datatype)
        if t.datatype == "BYTES":
            arrays[t.name] = np.full(shape, b"ok", dtype=object)
        elif np.issubdtype(dtype, np.floating):
            arrays[t.name] = rng.standard_normal(shape).astype(dtype)
        else:
            arrays[t.name] = rng.integers(0, 2 + i, size=shape).astype(dtype)
    return arrays


def main(model: str = "mlp", http_url: str = "127.0.0.1:8000", grpc_url: str = "127.0.0.1:8001") -> None:
    with HttpClient(http_url, model=model, timeout_s=10.0) as client:
        inputs = random_inputs(client.model_info(model))
        over_http = client.infer(inputs)  # no outputs named: every output the model returns
    with GrpcClient(grpc_url, model=model, timeout_s=10.0) as client:
        over_grpc = client.infer(inputs)
    for name, value in over_http.items():
        agree = np.allclose(value, over_grpc[name], atol=1e-5) if value.dtype != object else (value == over_grpc[name]).all()
        print(f"{name}: {value.dtype} {list(value.shape)}  HTTP and gRPC agree: {bool(agree)}")


if __name__ == "__main__":
    main(*sys.argv[1:])
