"""Accuracy gates, shared by the build stage's precision step and the TensorRT runtime: a model at a
lower precision (an FP16/BF16/INT8 ONNX on the CPU, a TensorRT engine on a GPU) against the FP32 ONNX,
on traffic-shaped inputs, with one set of thresholds per precision.

Inputs (:func:`feeds`). A gate feeds **every optimization profile** of the plan, batch 1 included: for
a text model one batch per profile, ``max`` rows of its batch bucket, lengths drawn from the traffic
sample's rows in its sequence bucket (words that are one token each), tokenized with the model's
tokenizer and padded the way the server pads them (to the plan's targets). For other models: random
tensors at each profile's ``opt`` shape, and, when the manifest has calibration data, its held-out
half re-batched to every batch bucket. Calibration uses the manifest's calibration data when there is
some (half calibrates, the other half judges), else traffic-shaped texts; calibration and gate draw
different texts (different seeds), so the gate checks on data the quantizer never saw.

A candidate may reuse its output buffers between calls, as Polygraphy's runners do
(``polygraphy/backend/base/runner.py``, ``BaseRunner.infer``: "Runners may reuse these output
buffers ... make a copy"; ``TrtRunner`` returns views of one host buffer per output that the next
call resizes in place): :func:`gate` copies each output as soon as it is returned.

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
from tritonbundle.plan import ModelPlan, Profile

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
def _encode(spec: ModelSpec, tokenizer_json: Path, factory: Any, lengths: Sequence[int]) -> list[list[int]]:
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(tokenizer_json))
    tok.no_padding()
    tok.enable_truncation(max_length=spec.tokenizer_max_length)
    return [tok.encode(factory.text(int(n))).ids for n in lengths]


def _token_feed(spec: ModelSpec, encoded: Sequence[Sequence[int]], length: int) -> Feed:
    ids = np.zeros((len(encoded), length), dtype=np.int64)
    mask = np.zeros_like(ids)
    for row, e in enumerate(encoded):
        e = list(e)[:length]
        ids[row, : len(e)] = e
        mask[row, : len(e)] = 1
    feed = {spec.inputs[0].name: ids, spec.inputs[1].name: mask}
    if len(spec.inputs) > 2:  # token type ids: one text per row, so all of type 0
        feed[spec.inputs[2].name] = np.zeros_like(ids)
    return feed


def _factory(spec: ModelSpec, seed: int) -> Any:
    from tritonbundle import traffic
    from tritonbundle.payloads import PayloadFactory

    if spec.traffic is None:
        raise BuildError(f"model {spec.name}: traffic-shaped inputs need a traffic sample (manifest 'traffic')")
    return PayloadFactory(traffic.load(spec.traffic), seed=seed, max_tokens=spec.max_sequence_length, max_batch=1)


def _text_calibration_feeds(spec: ModelSpec, plan: ModelPlan, tokenizer_json: Path, *, batches: int, rows: int,
                            seed: int) -> list[Feed]:
    """``batches`` batches of ``rows`` texts drawn from the traffic sample, neighbours in length together."""
    factory = _factory(spec, seed)
    encoded = sorted(_encode(spec, tokenizer_json, factory, [factory.draw()[0] for _ in range(batches * rows)]), key=len)
    return [
        _token_feed(spec, chunk, pad_length(max(len(e) for e in chunk), plan.padding_targets))
        for chunk in (encoded[s : s + rows] for s in range(0, len(encoded), rows))
    ]


def _text_gate_feeds(spec: ModelSpec, plan: ModelPlan, tokenizer_json: Path, *, seed: int) -> list[Feed]:
    """One batch per profile: its batch bucket's ``max`` rows, lengths from the sample's rows in its sequence
    bucket (spread over the bucket where the sample has none), padded as the server pads them."""
    factory = _factory(spec, seed)
    rows_lengths = factory.sample.row_lengths()
    out = []
    for profile in plan.profiles:
        bucket = profile.sequence
        assert bucket is not None  # a text model has a sequence axis
        inside = rows_lengths[(rows_lengths >= bucket.min) & (rows_lengths <= bucket.max)]
        pool = inside if inside.size else np.arange(bucket.min, bucket.max + 1)
        lengths = factory.rng.choice(pool, size=profile.batch.max)
        encoded = _encode(spec, tokenizer_json, factory, lengths)
        longest = min(max(len(e) for e in encoded), bucket.max)
        out.append(_token_feed(spec, encoded, pad_length(max(longest, bucket.min), plan.padding_targets)))
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


def _rebatched(spec: ModelSpec, plan: ModelPlan, held_out: Sequence[Feed]) -> list[Feed]:
    """The held-out samples as one batch per batch bucket (``max`` rows, samples repeated when too few)."""
    if not spec.batched:
        return list(held_out)
    pool = {n: np.concatenate([f[n] for f in held_out]) for n in held_out[0]}
    out = []
    for bucket in plan.batch_buckets:
        take = np.arange(bucket.max) % next(iter(pool.values())).shape[0]
        out.append({n: np.ascontiguousarray(a[take]) for n, a in pool.items()})
    return out


def _random_feed(spec: ModelSpec, profile: Profile, rng: np.random.Generator) -> Feed:
    feed: Feed = {}
    for t in spec.inputs:
        shape = profile.shapes[t.name][1]
        dtype = numpy_dtype(t.dtype)
        feed[t.name] = (np.zeros(shape, dtype=dtype) if t.dtype.startswith(("INT", "UINT", "BOOL"))
                        else rng.standard_normal(shape).astype(dtype))
    return feed


def fits(profile: Profile, feed: Feed) -> bool:
    """Whether every input's shape lies within the profile's min/max."""
    return all(
        len(a.shape) == len(profile.shapes[n][0])
        and all(lo <= d <= hi for lo, d, hi in zip(profile.shapes[n][0], a.shape, profile.shapes[n][2]))
        for n, a in feed.items()
    )


def feeds(spec: ModelSpec, plan: ModelPlan, *, tokenizer_json: Path | None, purpose: str) -> list[Feed]:
    """Inputs for calibration (``purpose="calibration"``) or for a gate (``"gate"``), see the module docstring."""
    seed = 1001 if purpose == "calibration" else 2002
    text = spec.text and tokenizer_json is not None
    if purpose == "gate":
        if text:  # a text model is always judged on traffic-shaped texts, whatever it was calibrated on
            assert tokenizer_json is not None
            return _text_gate_feeds(spec, plan, tokenizer_json, seed=seed)
        out: list[Feed] = []
        if spec.calibration is not None:
            data = _npz_feeds(spec, spec.calibration, rows=8)
            out = _rebatched(spec, plan, data[max(1, len(data) // 2):] or data)
        rng = np.random.default_rng(seed)
        return out + [_random_feed(spec, p, rng) for p in plan.profiles if not any(fits(p, f) for f in out)]
    if text and spec.calibration is None:
        assert tokenizer_json is not None
        return _text_calibration_feeds(spec, plan, tokenizer_json, batches=16, rows=8, seed=seed)
    if spec.calibration is not None:
        data = _npz_feeds(spec, spec.calibration, rows=8)
        return data[: max(1, len(data) // 2)]
    raise BuildError(
        f"model {spec.name}.calibration: INT8 needs calibration data for a model that is not a text model: "
        "a .npz holding one array per input (first axis: samples), shaped like real requests"
    )


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
    """Run both on ``inputs``; the result says whether ``candidate`` is within the precision's tolerance.
    The candidate's outputs are copied as they come back: it may reuse its buffers (module docstring)."""
    limit = tolerance(spec, precision)
    expected, got = [], []
    for feed in inputs:
        got.append({name: np.array(value, copy=True) for name, value in candidate(feed).items()})
        expected.append(reference(feed))
    rows, min_cos, mean_cos, max_abs, where = compare(expected, got)
    passed = min_cos >= limit.min_cosine and max_abs <= limit.max_abs
    return GateResult(what, precision, rows, min_cos, mean_cos, max_abs, where, limit, passed)
