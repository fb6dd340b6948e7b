"""`helm test`: the release's Service answers readiness, one inference, and guards its restricted API.

Settings come from the environment (the test pod's spec): TRITON_URL, MODEL, INPUT_NAME, OUTPUT_NAME,
TEXT, EXPECTED_DIMS, READY_TIMEOUT_S, and when the model-repository API is restricted, API_HEADER and
API_KEY. With gateway tenants, the edge lets inference through only with a tenant's key: TENANT_KEY (sent as
Authorization: Bearer), or SKIP_INFERENCE, why the inference step is skipped. Standard library only: runs in the tritonserver image.
"""

import json
import math
import os
import sys
import time
import urllib.error
import urllib.request

URL = os.environ["TRITON_URL"].rstrip("/")


def call(method, path, body=None, headers=None, timeout_s=10.0):
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(URL + path, data=data, method=method, headers=headers or {})
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout_s) as response:
            return response.status, response.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def fail(message):
    print(f"FAIL: {message}", file=sys.stderr)
    sys.exit(1)


def wait_ready():
    deadline = time.monotonic() + float(os.environ.get("READY_TIMEOUT_S", "300"))
    while True:
        try:
            status, _ = call("GET", "/v2/health/ready", timeout_s=5)
            if status == 200:
                print(f"ok: {URL}/v2/health/ready answered 200")
                return
            reason = f"HTTP {status}"
        except OSError as e:
            reason = str(e)
        if time.monotonic() > deadline:
            fail(f"{URL} not ready: {reason}")
        time.sleep(5)


def infer():
    model, text = os.environ["MODEL"], os.environ["TEXT"]
    if os.environ.get("SKIP_INFERENCE"):
        print(f"skip: no inference on {model}: {os.environ['SKIP_INFERENCE']}")
        return
    body = {"inputs": [{"name": os.environ["INPUT_NAME"], "datatype": "BYTES", "shape": [1, 1], "data": [text]}]}
    key = os.environ.get("TENANT_KEY", "").strip()
    headers = {"Authorization": f"Bearer {key}"} if key else None
    status, raw = call("POST", f"/v2/models/{model}/infer", body, headers=headers, timeout_s=60)
    if status != 200:
        fail(f"inference on {model} answered HTTP {status}: {raw[:500]!r}")
    outputs = {o["name"]: o for o in json.loads(raw)["outputs"]}
    name = os.environ["OUTPUT_NAME"]
    if name not in outputs:
        fail(f"{model} returned {sorted(outputs)}, not {name}")
    out = outputs[name]
    dims = int(os.environ["EXPECTED_DIMS"])
    if out["shape"] != [1, dims] or len(out["data"]) != dims:
        fail(f"{name} has shape {out['shape']} and {len(out['data'])} values, expected [1, {dims}]")
    values = [float(x) for x in out["data"]]
    norm = math.sqrt(sum(x * x for x in values))
    if not all(math.isfinite(x) for x in values) or norm == 0.0:
        fail(f"{name} is not a usable embedding (norm {norm})")
    print(f"ok: {model} embedded {text!r} into {dims} values (L2 norm {norm:.4f})")


def restricted():
    header, key = os.environ.get("API_HEADER"), os.environ.get("API_KEY")
    if not header:
        print("skip: the model-repository API is not restricted")
        return
    status, _ = call("POST", "/v2/repository/index", {})
    if status < 400:
        fail(f"/v2/repository/index answered {status} without the {header} header")
    status, raw = call("POST", "/v2/repository/index", {}, headers={header: key})
    if status != 200:
        fail(f"/v2/repository/index answered {status} with the key: {raw[:300]!r}")
    print(f"ok: the model-repository API refuses requests without {header} and accepts the key")


wait_ready()
infer()
restricted()
