"""Accuracy gates, shared by the build stage's precision step and the TensorRT runtime: a model at a
lower precision (an FP16/BF16/INT8 ONNX on the CPU, a TensorRT engine on a GPU) against the FP32 ONNX,
on traffic-shaped inputs, with one set of thresholds per precision.

Inputs (:func:`feeds`): for a text model, texts drawn from the traffic sample (lengths as the traffic
has them, words that are one token each), tokenized with the model's tokenizer and padded the way
the server pads them (to the plan's targets); calibration uses the manifest's calibration data
instead when there is some, but the gate always judges a text model on traffic-shaped texts. For
other models: the manifest's calibration data (half calibrates, the other half judges), else random
tensors at each profile's ``opt`` shape. Calibration and gate draw different texts (different
seeds): the gate checks on data the quantizer never saw.

Metrics, over every output row: the cosine between candidate and reference (the figure that matters
for embeddings) and the largest absolute difference.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tritonbundle.contract import pad_length
from tritonbundle.errors import BuildError
from tritonbundle.manifest import ModelSpec
from tritonbundle.modelconfig import numpy_dtype
from tritonbundle.plan import ModelPlan

Feed = dict[str, npt.NDArray[Any]]
Outputs = Mapping[str, npt.NDArray[Any]]


@dataclass(frozen=True)
class Tolerance:
    min_cosine: float
    max_abs: float


#: Per precision: the least cosine of any output row with FP32, the largest absolute difference.
#: The manifest's ``tolerance`` replaces ``max_abs``.
TOLERANCES = {
    "fp32": Tolerance(0.9999, 1e-3),  # TensorRT FP32 (TF32 off) against ONNX Runtime FP32
    "fp16": Tolerance(0.999, 2e-2),
    "bf16": Tolerance(0.995, 5e-2),
    "int8": Tolerance(0.97, 1.5e-1),
}


@dataclass(frozen=True)
class GateResult:
    what: str
    precision: str
    rows: int
    min_cosine: float
    mean_cosine: float
    max_abs: float
    worst: str
    tolerance: Tolerance
    passed: bool

    def describe(self) -> str:
        verdict = "passed" if self.passed else "FAILED"
        return (f"{self.what} vs FP32: min cosine {self.min_cosine:.5f} (mean {self.mean_cosine:.5f}), max |diff| "
                f"{self.max_abs:.2e} over {self.rows} rows; limits cosine >= {self.tolerance.min_cosine:g}, "
                f"|diff| <= {self.tolerance.max_abs:g}: {verdict}")

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def tolerance(spec: ModelSpec, precision: str) -> Tolerance:
    base = TOLERANCES[precision]
    return Tolerance(base.min_cosine, spec.tolerance) if spec.tolerance else base


# -- inputs --------------------------------------------------------------------------------------------
def _text_feeds(spec: ModelSpec, plan: ModelPlan, tokenizer_json: Path, *, batches: int, rows: int, seed: int) -> list[Feed]:
    from tokenizers import Tokenizer

    from tritonbundle import traffic
    from tritonbundle.payloads import PayloadFactory

    if spec.traffic is None:
        raise BuildError(f"model {spec.name}: traffic-shaped inputs need a traffic sample (manifest 'traffic')")
    factory = PayloadFactory(traffic.load(spec.traffic), seed=seed, max_tokens=spec.max_sequence_length, max_batch=1)
    tok = Tokenizer.from_file(str(tokenizer_json))
    tok.no_padding()
    tok.enable_truncation(max_length=spec.tokenizer_max_length)
    encoded = sorted((tok.encode(factory.text(factory.draw()[0])).ids for _ in range(batches * rows)), key=len)
    ids_name, mask_name = (t.name for t in spec.inputs)
    out = []
    for start in range(0, len(encoded), rows):  # neighbours in length share a batch, as targets group them
        chunk = encoded[start : start + rows]
        length = pad_length(max(len(e) for e in chunk), plan.padding_targets)
        ids = np.zeros((len(chunk), length), dtype=np.int64)
        mask = np.zeros_like(ids)
        for row, e in enumerate(chunk):
            ids[row, : len(e)] = e
            mask[row, : len(e)] = 1
        out.append({ids_name: ids, mask_name: mask})
    return out


def _npz_feeds(spec: ModelSpec, path: Path, *, rows: int) -> list[Feed]:
    try:
        data = np.load(path)
    except (OSError, ValueError) as e:
        raise BuildError(f"model {spec.name}: calibration data {path} is not a readable .npz: {e}") from e
    names = [t.name for t in spec.inputs]
    missing = [n for n in names if n not in data.files]
    if missing:
        raise BuildError(f"model {spec.name}: calibration data {path} has no arrays for inputs {missing} (has {data.files})")
    total = min(int(data[n].shape[0]) for n in names)
    if total == 0:
        raise BuildError(f"model {spec.name}: calibration data {path} holds no samples")
    return [{n: np.ascontiguousarray(data[n][s : s + rows]) for n in names} for s in range(0, total, rows)]


def _random_feeds(spec: ModelSpec, plan: ModelPlan, *, seed: int) -> list[Feed]:
    rng = np.random.default_rng(seed)
    out = []
    for profile in plan.profiles:
        feed: Feed = {}
        for t in spec.inputs:
            shape = profile.shapes[t.name][1]
            dtype = numpy_dtype(t.dtype)
            feed[t.name] = (np.zeros(shape, dtype=dtype) if t.dtype.startswith(("INT", "UINT", "BOOL"))
                            else rng.standard_normal(shape).astype(dtype))
        out.append(feed)
    return out


def feeds(spec: ModelSpec, plan: ModelPlan, *, tokenizer_json: Path | None, purpose: str) -> list[Feed]:
    """Inputs for calibration (``purpose="calibration"``) or for a gate (``"gate"``), see the module docstring."""
    seed = 1001 if purpose == "calibration" else 2002
    if spec.task == "text-embedding" and tokenizer_json is not None and (purpose == "gate" or spec.calibration is None):
        # A text model is always judged on traffic-shaped texts, whatever it was calibrated on.
        return _text_feeds(spec, plan, tokenizer_json, batches=16 if purpose == "calibration" else 8, rows=8, seed=seed)
    if spec.calibration is not None:
        data = _npz_feeds(spec, spec.calibration, rows=8)
        half = max(1, len(data) // 2)
        return data[:half] if purpose == "calibration" else (data[half:] or data)
    if purpose == "calibration":
        raise BuildError(
            f"model {spec.name}.calibration: INT8 needs calibration data for a model that is not a text model: "
            "a .npz holding one array per input (first axis: samples), shaped like real requests"
        )
    return _random_feeds(spec, plan, seed=seed)


# -- the gate ------------------------------------------------------------------------------------------
def onnx_runner(path: Path) -> Callable[[Feed], Outputs]:
    import onnxruntime as ort

    session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]

    def run(feed: Feed) -> Outputs:
        return dict(zip(names, session.run(names, feed)))

    return run


def compare(reference: Sequence[Outputs], candidate: Sequence[Outputs]) -> tuple[int, float, float, float, str]:
    """(rows, min cosine, mean cosine, max |diff|, where the worst difference is) over every output."""
    cosines: list[float] = []
    worst, where = 0.0, ""
    for batch, (ref, got) in enumerate(zip(reference, candidate)):
        for name, expected in ref.items():
            a = np.asarray(expected, dtype=np.float64)
            b = np.asarray(got[name], dtype=np.float64)
            if a.shape != b.shape:
                raise BuildError(f"output {name}: shape {list(b.shape)}, the FP32 model gives {list(a.shape)}")
            diff = np.abs(a - b)
            if diff.size and float(diff.max()) > worst:
                worst = float(diff.max())
                where = f"{name}{list(map(int, np.unravel_index(int(diff.argmax()), diff.shape)))} in batch {batch}"
            rows_a = a.reshape(a.shape[0], -1) if a.ndim > 1 else a.reshape(1, -1)
            rows_b = b.reshape(rows_a.shape)
            norms = np.linalg.norm(rows_a, axis=1) * np.linalg.norm(rows_b, axis=1)
            live = norms > 0  # all-zero rows (padding) have no direction
            cosines += list((rows_a[live] * rows_b[live]).sum(axis=1) / norms[live])
    if not cosines:
        return 0, 1.0, 1.0, worst, where
    return len(cosines), float(np.min(cosines)), float(np.mean(cosines)), worst, where


def gate(what: str, spec: ModelSpec, precision: str, reference: Callable[[Feed], Outputs],
         candidate: Callable[[Feed], Outputs], inputs: Sequence[Feed]) -> GateResult:
    """Run both on ``inputs``; the result says whether ``candidate`` is within the precision's tolerance."""
    limit = tolerance(spec, precision)
    rows, min_cos, mean_cos, max_abs, where = compare([reference(f) for f in inputs], [candidate(f) for f in inputs])
    passed = min_cos >= limit.min_cosine and max_abs <= limit.max_abs
    return GateResult(what, precision, rows, min_cos, mean_cos, max_abs, where, limit, passed)
