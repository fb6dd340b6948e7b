"""Precision in the ONNX graph: FP16/BF16 by a mixed-precision rewrite, INT8 by Q/DQ quantization.

TensorRT 10.12 deprecated and TensorRT 11 removed the builder's precision flags (``BuilderFlag.FP16``,
``INT8``, calibrators): a network is strongly typed and runs in the types its ONNX declares. So the
precision is decided here, on ONNX, where ONNX Runtime can check its accuracy on any machine
(:mod:`tritonbundle.build.accuracy`), and the engine build only follows the graph.

* **fp16 / bf16** (:func:`mixed_precision`): the GEMM-class nodes (MatMul, Gemm, Conv) run in the low
  precision with their constant weights stored in it; elementwise and layout nodes stay low where
  every input already is; everything else (Softmax, normalisations, reductions, the attention mask's
  arithmetic, casts) stays FP32, with Cast nodes at the borders. Inputs and outputs keep their types.
  The same rewrite done by hand rather than with onnxconverter-common (whose converter produced an
  invalid graph for the MiniLM export: a Cast whose declared output type it changed) or ModelOpt
  AutoCast (its onnx extra pins onnx ~1.21 and onnxruntime-gpu and pulls cupy): about a hundred lines
  whose every decision is tested.
* **int8** (:func:`quantize_int8`): ONNX Runtime's static quantization to Q/DQ, configured the way
  TensorRT's ONNX parser requires (signed INT8, symmetric, zero point 0, per-channel weights, opset
  >= 13, no INT32 bias quantization), on the GEMMs with a constant weight, calibrated by min/max on
  traffic-shaped inputs. GEMMs that read the output of a non-linear activation (the FFN down
  projection of a transformer, whose inputs have outliers ten times their 99.9th percentile) stay
  FP32: quantizing them took MiniLM from cosine 0.98 to 0.86 against FP32.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

from tritonbundle.errors import BuildError
from tritonbundle.files import onnx_data, onnx_weight_files, save_onnx, sha256, tensor_bytes
from tritonbundle.log import LOG
from tritonbundle.manifest import ModelSpec
from tritonbundle.plan import ModelPlan

#: Low-precision type per manifest precision (onnx.TensorProto values: FLOAT16 = 10, BFLOAT16 = 16).
LOW_TYPES = {"fp16": 10, "bf16": 16}
FLOAT = 1
#: Nodes that run in low precision whenever they have a float input (the FLOPs are here).
GEMMS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose"})
#: Elementwise nodes that stay in low precision when every non-constant float input already is.
ELEMENTWISE = frozenset({"Add", "Sub", "Mul", "Div", "Erf", "Tanh", "Relu", "Sigmoid", "Gelu", "Neg", "Abs"})
#: Layout nodes that carry their data input's type (input 0; Concat: every input).
LAYOUT = frozenset({"Reshape", "Transpose", "Squeeze", "Unsqueeze", "Slice", "Split", "Flatten", "Identity",
                    "Expand", "Concat"})
#: Activations whose outputs feed a GEMM that INT8 leaves in FP32.
ACTIVATIONS = frozenset({"Erf", "Gelu", "Relu", "Sigmoid", "Tanh", "Softplus", "HardSigmoid", "LeakyRelu"})
#: Nodes between an activation and the GEMM that still count as "reading the activation's output".
_PASS_THROUGH = ELEMENTWISE | LAYOUT


#: Initializers up to this size stay in the copy that shape inference reads (shape and index tensors:
#: their values can matter); larger ones (the weights) enter it as typed graph inputs. The same 1 KiB
#: below which exporters keep a tensor inside the graph when they save the weights beside it.
_INFERRED_WITH_VALUES = 1024


def _shell(model: Any, initializers: Iterable[Any]) -> Any:
    """A new ModelProto with ``model``'s every field (graph included) but its initializers, which are
    ``initializers``: no copy of the weights being replaced, and none over protobuf's 2 GB."""
    import onnx

    out = onnx.ModelProto()
    for message, target in ((model, out), (model.graph, out.graph)):
        for descriptor, value in message.ListFields():
            if descriptor.name in ("graph", "initializer"):
                continue
            if descriptor.label == descriptor.LABEL_REPEATED:
                getattr(target, descriptor.name).extend(value)
            elif descriptor.message_type is not None:
                getattr(target, descriptor.name).CopyFrom(value)
            else:
                setattr(target, descriptor.name, value)
    out.graph.initializer.extend(initializers)
    return out


def _inferred(model: Any, *, strict: bool) -> Any:
    """onnx's shape inference over ``model``'s structure. ``infer_shapes`` serializes the model it is given
    (over protobuf's 2 GB it raises ValueError: "exceeds the size limit"), so it is given a copy whose
    large initializers are typed graph inputs of the same dims: the types it infers are the same."""
    import onnx
    from onnx import helper

    large = {t.name for t in model.graph.initializer if tensor_bytes(t) > _INFERRED_WITH_VALUES}
    skeleton = _shell(model, (t for t in model.graph.initializer if t.name not in large))
    listed = {i.name for i in model.graph.input}
    skeleton.graph.input.extend(helper.make_tensor_value_info(t.name, t.data_type, t.dims)
                                for t in model.graph.initializer if t.name in large and t.name not in listed)
    return onnx.shape_inference.infer_shapes(skeleton, strict_mode=strict)


def _float_tensors(model: Any) -> set[str]:
    """Names of every FP32 tensor in the graph (inputs, initializers, intermediates, outputs)."""
    g = _inferred(model, strict=False).graph
    out = {i.name for i in model.graph.initializer if i.data_type == FLOAT}
    for vi in (*g.input, *g.value_info, *g.output):
        if vi.type.tensor_type.elem_type == FLOAT:
            out.add(vi.name)
    for node in g.node:
        if node.op_type == "Constant" and node.attribute and node.attribute[0].t.data_type == FLOAT:
            out.add(node.output[0])
    return out


def _low_plan(model: Any) -> tuple[set[str], set[str]]:
    """Which nodes run in low precision (by index), and the graph's FP32 tensors."""
    floats = _float_tensors(model)
    constants = {i.name for i in model.graph.initializer} | {n.output[0] for n in model.graph.node if n.op_type == "Constant"}
    low_tensors: set[str] = set()
    low_nodes: set[str] = set()
    for index, node in enumerate(model.graph.node):
        float_inputs = [i for i in node.input if i and i in floats]
        if not float_inputs:
            continue
        dynamic = [i for i in float_inputs if i not in constants]
        if node.op_type in GEMMS:
            low = True
        elif node.op_type in ELEMENTWISE:
            low = bool(dynamic) and all(i in low_tensors for i in dynamic)
        elif node.op_type in LAYOUT:
            data = float_inputs if node.op_type == "Concat" else float_inputs[:1]
            low = all(i in low_tensors for i in data) and bool(dynamic)
        else:
            low = False
        if low:
            low_nodes.add(f"{index}")
            low_tensors.update(o for o in node.output if o in floats)
    return low_nodes, floats


def mixed_precision(model: Any, precision: str, *, emulate: bool = False) -> Any:
    """A copy of ``model`` with its GEMM-class nodes (and what follows them cheaply) in ``precision``.

    ``emulate``: keep every tensor FP32 but round what would be low precision to it and back (Cast
    pairs, rounded weights). ONNX Runtime has no CPU kernels for BF16 arithmetic, so the BF16
    accuracy gate runs this emulation: storage rounding as the GPU does it, FP32 accumulation as
    TensorRT's BF16 GEMMs do.
    """
    from onnx import helper

    if precision not in LOW_TYPES:
        raise BuildError(f"mixed precision is fp16 or bf16, not {precision!r}")
    low_type = LOW_TYPES[precision]
    low_nodes, floats = _low_plan(model)
    initializers = {i.name: i for i in model.graph.initializer}
    outputs = {o.name for o in model.graph.output}
    nodes: list[Any] = []
    extra_inits: list[Any] = []
    made: dict[tuple[str, str], str] = {}  # (tensor, "low" | "fp32") -> the converted tensor's name
    is_low: set[str] = set()  # tensors already in low precision (emulation: already rounded)

    def cast(name: str, tag: str) -> str:
        if (name, tag) not in made:
            target = f"{name}__{precision if tag == 'low' else 'fp32'}"
            if emulate:
                nodes.append(helper.make_node("Cast", [name], [f"{target}_bits"], to=low_type, name=f"{target}_round"))
                nodes.append(helper.make_node("Cast", [f"{target}_bits"], [target], to=FLOAT, name=f"{target}_back"))
            else:
                nodes.append(helper.make_node("Cast", [name], [target], to=low_type if tag == "low" else FLOAT,
                                              name=f"{target}_cast"))
            made[(name, tag)] = target
        return made[(name, tag)]

    def weight(name: str) -> str:
        if (name, "low") not in made:
            extra_inits.append(_low_tensor(initializers[name], f"{name}__{precision}", precision, emulate=emulate))
            made[(name, "low")] = extra_inits[-1].name
        return made[(name, "low")]

    for index, node in enumerate(model.graph.node):
        low = f"{index}" in low_nodes
        inputs = list(node.input)
        for position, name in enumerate(inputs):
            if not name or name not in floats:
                continue
            if low and name not in is_low:
                inputs[position] = weight(name) if name in initializers else cast(name, "low")
            elif not low and name in is_low and not emulate:
                inputs[position] = cast(name, "fp32")
        rewritten = helper.make_node(node.op_type, inputs, list(node.output), name=node.name, domain=node.domain or None)
        rewritten.attribute.extend(node.attribute)
        after = []
        if low:
            for position, name in enumerate(node.output):
                if name not in floats:
                    continue
                if emulate:  # round the result, as low-precision storage would
                    rewritten.output[position] = f"{name}__raw"
                    after.append(helper.make_node("Cast", [f"{name}__raw"], [f"{name}__bits"], to=low_type, name=f"{name}_round"))
                    after.append(helper.make_node("Cast", [f"{name}__bits"], [name], to=FLOAT, name=f"{name}_back"))
                    is_low.add(name)
                elif name in outputs:  # a graph output keeps its declared type
                    rewritten.output[position] = f"{name}__{precision}"
                    after.append(helper.make_node("Cast", [f"{name}__{precision}"], [name], to=FLOAT, name=f"{name}_to_fp32"))
                else:
                    is_low.add(name)
        nodes.append(rewritten)
        nodes.extend(after)
    used = {i for n in nodes for i in n.input}
    out = _shell(model, [*(i for i in model.graph.initializer if i.name in used), *extra_inits])
    g = out.graph
    del g.node[:]
    g.node.extend(nodes)
    del g.value_info[:]
    g.value_info.extend(_inferred(out, strict=True).graph.value_info)  # and strict: a type error is raised here
    return out


def _low_tensor(tensor: Any, name: str, precision: str, *, emulate: bool) -> Any:
    """An initializer in low precision (or, emulated, FP32 holding the rounded values)."""
    from onnx import helper, numpy_helper

    values = numpy_helper.to_array(tensor).astype(np.float32, copy=False)
    if emulate:
        return numpy_helper.from_array(_round_bf16(values) if precision == "bf16" else
                                       values.astype(np.float16).astype(np.float32), name)
    if precision == "fp16":
        return numpy_helper.from_array(values.astype(np.float16), name)
    return helper.make_tensor(name, LOW_TYPES["bf16"], values.shape, _bf16_bits(values).tobytes(), raw=True)


def _bf16_bits(values: npt.NDArray[np.float32]) -> npt.NDArray[np.uint16]:
    """Round-to-nearest-even FP32 -> BF16, as the raw 16 bits."""
    bits = np.ascontiguousarray(values, dtype=np.float32).view(np.uint32)
    rounded = bits + 0x7FFF + ((bits >> 16) & 1)
    return (rounded >> 16).astype(np.uint16)


def _round_bf16(values: npt.NDArray[np.float32]) -> npt.NDArray[np.float32]:
    return (_bf16_bits(values).astype(np.uint32) << 16).view(np.float32)


# -- INT8 ---------------------------------------------------------------------------------------------
def after_activation(model: Any) -> list[str]:
    """GEMMs (by node name) whose dynamic input comes from a non-linear activation through elementwise
    and layout nodes only: INT8 leaves these in FP32 (their inputs carry outliers)."""
    producers = {o: n for n in model.graph.node for o in n.output}
    constants = {i.name for i in model.graph.initializer}
    found = []
    for node in model.graph.node:
        if node.op_type not in ("MatMul", "Gemm") or not any(i in constants for i in node.input):
            continue
        todo = [i for i in node.input if i and i not in constants]
        seen: set[str] = set()
        while todo:
            name = todo.pop()
            producer = producers.get(name)
            if producer is None or name in seen:
                continue
            seen.add(name)
            if producer.op_type in ACTIVATIONS:
                found.append(node.name)
                break
            if producer.op_type in _PASS_THROUGH:
                todo.extend(i for i in producer.input if i and i not in constants)
    return found


def quantize_int8(source: Path, target: Path, feeds: Iterable[Mapping[str, npt.NDArray[Any]]], work: Path) -> dict[str, Any]:
    """Q/DQ INT8 ONNX from ``source``, calibrated (min/max) on ``feeds``. Returns what was quantized."""
    import onnx
    from onnxruntime.quantization import (
        CalibrationDataReader,
        CalibrationMethod,
        QuantFormat,
        QuantType,
        quantize_static,
    )
    from onnxruntime.quantization.shape_inference import quant_pre_process

    model = onnx.load(str(source), load_external_data=False)
    if max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0) < 13:
        raise BuildError(f"{source}: INT8 Q/DQ with per-channel weights needs ONNX opset >= 13 (TensorRT and ONNX Runtime)")
    work.mkdir(parents=True, exist_ok=True)
    prepared = work / "int8.preprocessed.onnx"
    # Weights saved beside the graph (as a model over 2 GB must be) stay beside it, in "<file>.data".
    external = bool(onnx_weight_files(source))
    for stale in (onnx_data(prepared), onnx_data(target)):  # onnx appends to an existing one
        stale.unlink(missing_ok=True)
    quant_pre_process(str(source), str(prepared), skip_symbolic_shape=True, save_as_external_data=external,
                      all_tensors_to_one_file=True, external_data_location=onnx_data(prepared).name)
    model = onnx.load(str(prepared), load_external_data=False)
    gemms = [n.name for n in model.graph.node if n.op_type in ("MatMul", "Gemm")
             and any(i in {x.name for x in model.graph.initializer} for i in n.input)]
    kept = after_activation(model)
    batches = list(feeds)
    if not batches:
        raise BuildError("INT8 calibration needs at least one batch of inputs")

    class Reader(CalibrationDataReader):  # type: ignore[misc]
        def __init__(self) -> None:
            self._it: Iterator[Mapping[str, Any]] = iter(batches)

        def get_next(self) -> Mapping[str, Any] | None:
            return next(self._it, None)

    quantize_static(
        str(prepared), str(target), Reader(), quant_format=QuantFormat.QDQ,
        activation_type=QuantType.QInt8, weight_type=QuantType.QInt8, per_channel=True,
        calibrate_method=CalibrationMethod.MinMax, op_types_to_quantize=["MatMul", "Gemm"],
        nodes_to_quantize=[n for n in gemms if n not in kept],
        extra_options={"ActivationSymmetric": True, "WeightSymmetric": True, "QuantizeBias": False},
        use_external_data_format=external,
    )
    prepared.unlink(missing_ok=True)
    onnx_data(prepared).unlink(missing_ok=True)
    return {"quantized_gemms": len(gemms) - len(kept), "fp32_gemms": len(kept), "calibration_batches": len(batches),
            "method": "minmax, symmetric INT8, per-channel weights (ONNX Runtime quantize_static, QDQ)"}


# -- the build step -------------------------------------------------------------------------------------
#: Bumped when the rewrite or the quantization recipe changes, so converted models are redone.
REVISION = "1"


@dataclass(frozen=True)
class Lowered:
    """The ONNX a runtime serves at the manifest's precision, and the FP32 ONNX it is checked against."""

    onnx_path: Path
    reference: Path
    report: dict[str, Any] = field(default_factory=dict)


def _key(spec: ModelSpec, fp32: Path, tokenizer_json: Path | None) -> dict[str, str]:
    import importlib.metadata as md

    key = {"precision": spec.precision, "revision": REVISION, "source_sha256": sha256(fp32)}
    for dist in ("onnx", "onnxruntime"):
        key[dist] = md.version(dist)
    if spec.precision == "int8":
        # What the calibration reads: a stale scale after the data or the model changed is a wrong model.
        if spec.calibration is not None:
            key["calibration_sha256"] = sha256(spec.calibration) if spec.calibration.exists() else "missing"
        else:
            key["traffic_sha256"] = sha256(spec.traffic) if spec.traffic and spec.traffic.exists() else "-"
            key["tokenizer_sha256"] = sha256(tokenizer_json) if tokenizer_json and tokenizer_json.exists() else "-"
    return key


def lower(spec: ModelSpec, plan: ModelPlan, fp32: Path, tokenizer_json: Path | None, work: Path) -> Lowered:
    """Convert ``fp32`` to the manifest's precision (reusing a conversion whose inputs all match), check
    it against ``fp32`` on traffic-shaped inputs, and refuse it, naming the figures, when it misses."""
    import onnx

    from tritonbundle.runtimes import accuracy

    if spec.precision == "fp32":
        return Lowered(fp32, fp32)
    work.mkdir(parents=True, exist_ok=True)
    target = work / f"model.{spec.precision}.onnx"
    record_path = work / f"model.{spec.precision}.json"
    key = _key(spec, fp32, tokenizer_json)
    if target.exists() and record_path.exists():
        record = json.loads(record_path.read_text())
        if record.get("key") == key and record.get("gate", {}).get("passed"):
            LOG.info("    %s: %s is up to date (%s); reused", spec.name, target.name, record_path.name)
            return Lowered(target, fp32, record)
    details: dict[str, Any] = {}
    checked = target
    if spec.precision in LOW_TYPES:
        model = onnx.load(str(fp32))
        save_onnx(mixed_precision(model, spec.precision), target)
        if spec.precision == "bf16":  # no BF16 kernels in ONNX Runtime on the CPU: check the emulation
            checked = work / "model.bf16.emulated.onnx"
            save_onnx(mixed_precision(model, "bf16", emulate=True), checked)
            details["checked"] = "BF16 emulated in FP32 (storage rounded to BF16, FP32 accumulation)"
        details["rewrite"] = "GEMM-class nodes and what follows them cheaply in low precision; the rest FP32"
    else:
        calibration = accuracy.feeds(spec, plan, tokenizer_json=tokenizer_json, purpose="calibration")
        details.update(quantize_int8(fp32, target, calibration, work))
    onnx.checker.check_model(str(target), full_check=True)
    result = accuracy.gate(f"{spec.precision.upper()} ONNX (ONNX Runtime, CPU)", spec, spec.precision,
                           accuracy.onnx_runner(fp32), accuracy.onnx_runner(checked),
                           accuracy.feeds(spec, plan, tokenizer_json=tokenizer_json, purpose="gate"))
    record = {"key": key, "gate": result.to_json(), "details": details}
    record_path.write_text(json.dumps(record, indent=2))
    LOG.info("    %s: %s", spec.name, result.describe())
    if not result.passed:
        target.unlink(missing_ok=True)
        onnx_data(target).unlink(missing_ok=True)
        raise BuildError(
            f"model {spec.name}: the {spec.precision} model misses the accuracy gate: {result.describe()}; worst at "
            f"{result.worst}. The repository was not changed. " + (
                "Check the calibration data: it must look like real requests (lengths, contents)."
                if spec.precision == "int8" else "Keep this model at a higher precision.")
        )
    return Lowered(target, fp32, record)
