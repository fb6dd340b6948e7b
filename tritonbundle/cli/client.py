"""Client commands: ``infer``, ``health``, ``models``, ``load``, ``unload``."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from tritonbundle.cli import args as shared
from tritonbundle.cli import defaults
from tritonbundle.errors import (
    ClientError,
    ConfigError,
    ServerUnavailableError,
    TritonBundleError,
    UnauthorizedError,
)

if TYPE_CHECKING:
    from tritonbundle.clients.sync import _BaseClient

url = shared.url


def client(args: argparse.Namespace, *, check_model: bool = True, fail_fast: bool = False) -> _BaseClient:
    """A connected client for the command's server. ``fail_fast`` (health, models): one attempt, no wait
    for readiness, so a server that is down is reported at once; inference keeps the retries."""
    from tritonbundle.clients import RetryPolicy, connect

    address = url(args)
    options: dict[str, Any] = {}
    if fail_fast:
        options = {"retry": RetryPolicy(max_attempts=1), "connect_timeout_s": min(2.0, args.timeout_s), "wait": False}
    return connect(
        address, protocol=args.protocol, model=getattr(args, "model", defaults.MODEL), timeout_s=args.timeout_s,
        check_model=check_model, api_key=shared.read_key(args, address), **options,
    )


def unreachable(args: argparse.Namespace, error: BaseException) -> TritonBundleError:
    """The error a command reports when the server cannot be reached: its address and what to check."""
    import re

    causes = re.findall(r"\(([^()]+)\)", str(error))  # "... cannot reach the server ([Errno 111] Connection refused)"
    reason = causes[-1] if causes else str(error)
    return TritonBundleError(
        f"cannot reach a server at {url(args)} over {args.protocol} ({reason}); is `tritonbundle serve` running "
        f"there? Give its address with --url or ${defaults.URL_ENV}")


def locked(args: argparse.Namespace) -> TritonBundleError:
    address = url(args)
    return TritonBundleError(
        f"the server at {address} locks this API with a key: set ${args.api_key_env} to it, or pass --api-key-file "
        f"(a local `tritonbundle serve` writes the key it made up to {shared.key_file(address)})")


def cmd_infer(args: argparse.Namespace) -> int:
    """Call any model the way its task says: texts to a text model (embed, classify, or rerank against
    --query), tensors to a tensor model (files, JSON or random data of its declared shapes)."""
    with client(args) as c:
        info = c.model_info(args.model)
        task = info.kind()
        out = _infer_tensors(args, c, info) if task == "tensor" else _infer_texts(args, c, task)
    json.dump(out, sys.stdout)
    sys.stdout.write("\n")
    return 0


def _round(values: Any) -> Any:
    import numpy as np

    array = np.asarray(values)
    if array.dtype.kind == "f":
        return np.round(array.astype(np.float64), 6).tolist()
    if array.dtype.kind in "OSU":
        return [[v.decode() if isinstance(v, bytes) else v for v in row] if isinstance(row, list) else
                (row.decode() if isinstance(row, bytes) else row) for row in array.tolist()]
    return array.tolist()


def _infer_texts(args: argparse.Namespace, c: Any, task: str) -> Any:
    if args.input or args.inputs or args.random:
        raise ConfigError(f"model {args.model} takes text ({task}): pass texts, not --input/--inputs/--random")
    texts = list(args.texts) or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    if not texts:
        raise TritonBundleError("no texts: pass them as arguments or one per line on stdin")
    if task == "text-pair":
        if not args.query:
            raise ConfigError(f"model {args.model} scores (query, text) pairs: pass --query and the texts to score")
        scores = c.rerank(args.query, texts)
        return [{"text": t, "score": round(float(s), 6)} for t, s in zip(texts, scores)]
    if args.query:
        raise ConfigError(f"--query is for text-pair models; {args.model} is {task}")
    if task == "text-classification":
        return [{"text": t, "label": r.label, "score": round(float(r.score), 6), "logits": _round(r.logits)}
                for t, r in zip(texts, c.classify(texts))]
    embeddings = c.embed(texts)
    out = [{"text": t, "embedding": [round(float(x), 6) for x in e]} for t, e in zip(texts, embeddings)]
    return [o["embedding"] for o in out] if args.compact else out


def _infer_tensors(args: argparse.Namespace, c: Any, info: Any) -> Any:
    """Inputs from --inputs (.npz), --input NAME=FILE (.npy or .json), or --random; outputs as JSON (or
    into --out, a .npz)."""
    import numpy as np

    from tritonbundle.payloads import TensorRequests, random_array, tensor_inputs, typical_sizes

    if args.texts or args.query:
        raise ConfigError(f"model {args.model} takes tensors ({', '.join(t.name for t in info.inputs)}), not texts: "
                          "use --input NAME=FILE, --inputs FILE.npz or --random")
    arrays: dict[str, Any] = {}
    if args.inputs:
        try:
            with np.load(args.inputs) as data:
                arrays.update({name: np.asarray(data[name]) for name in data.files})
        except (OSError, ValueError, AttributeError) as e:  # no such file, not a .npz (a .npy has no .files), pickled
            raise ConfigError(f"--inputs {args.inputs}: not a readable .npz of arrays ({type(e).__name__}: {e})") from e
    for item in args.input or ():
        name, _, path = item.partition("=")
        if not path:
            raise ConfigError(f"--input {item}: give NAME=FILE (.npy or .json)")
        arrays[name] = _read_array(Path(path), name, info)
    if args.random:
        batched = info.max_batch_size > 0
        inputs = tensor_inputs({t.name: (t.datatype, tuple(t.shape)) for t in info.inputs}, info.parameters, batched)
        shapes = dict(_shape(s) for s in args.shape or ())
        sizes = typical_sizes(info.parameters)
        made = TensorRequests(inputs, batched=batched, max_batch=1, seed=args.seed, typical=sizes).arrays()
        for name, shape in shapes.items():
            t = next((t for t in inputs if t.name == name), None)
            if t is None:
                raise ConfigError(f"--shape {name}: the model has no such input ({', '.join(i.name for i in inputs)})")
            made[name] = random_array(t, list(shape), np.random.default_rng(args.seed))
        arrays = {**made, **arrays}
    missing = [t.name for t in info.inputs if t.name not in arrays]
    if missing:
        raise ConfigError(f"model {args.model} needs inputs {missing}: give them with --input NAME=FILE, --inputs "
                          "FILE.npz, or --random")
    outputs = c.infer(arrays, model=args.model)
    if args.out:
        np.savez(args.out, **outputs)
        return {name: {"shape": list(a.shape), "datatype": str(a.dtype), "saved": str(args.out)}
                for name, a in outputs.items()}
    return {name: {"shape": list(np.asarray(a).shape), "data": _round(a)} for name, a in outputs.items()}


def _shape(item: str) -> tuple[str, tuple[int, ...]]:
    name, _, dims = item.partition("=")
    try:
        shape = tuple(int(d) for d in dims.lower().split("x"))
    except ValueError:
        shape = ()
    if not name or not shape or any(d < 1 for d in shape):
        raise ConfigError(f"--shape {item}: give NAME=DIMS like pixels=1x3x224x224")
    return name, shape


def _read_array(path: Path, name: str, info: Any) -> Any:
    import numpy as np

    from tritonbundle.payloads import NUMPY

    if not path.is_file():
        raise ConfigError(f"--input {name}={path}: no such file")
    try:
        if path.suffix == ".json":
            declared = next((t.datatype for t in info.inputs if t.name == name), "FP32")
            return np.asarray(json.loads(path.read_text()), dtype=NUMPY.get(declared, np.float32))
        array = np.load(path)  # allow_pickle stays False: a file is data, never code
    except (OSError, ValueError) as e:  # JSONDecodeError is a ValueError; so are a ragged list and pickled data
        raise ConfigError(f"--input {name}={path}: not a readable array ({type(e).__name__}: {e})") from e
    if not isinstance(array, np.ndarray):  # a .npz given to --input
        array.close()
        raise ConfigError(f"--input {name}={path}: holds several arrays (.npz): give it with --inputs")
    return array


def cmd_load(args: argparse.Namespace) -> int:
    """Load or unload a model on a server running with explicit model control."""
    try:
        return _load(args)
    except UnauthorizedError as e:
        raise locked(args) from e


def _load(args: argparse.Namespace) -> int:
    with client(args, check_model=False) as c:
        for name in args.names:
            if args.command == "unload":
                c.unload_model(name)
            else:
                try:
                    c.load_model(name)
                except ClientError as e:
                    if args.repository is None:
                        raise
                    _quarantine_refused(c, args.repository, name, e)
                    return 1
            print(f"{args.command}ed {name}")
    return 0


def _quarantine_refused(c: Any, repository: Path, name: str, error: ClientError) -> None:
    """Move the versions the server refused out of ``repository`` and load what is left (the version
    that was serving), so that neither this server nor its next start tries the broken one again."""
    from tritonbundle.server import quarantine, refused_versions

    refused = {v: str(error) for v in refused_versions(error)}
    moved = [quarantine(repository, name, v, reason) for v, reason in sorted(refused.items())
             if (repository / name / v).is_dir()]
    if moved:
        c.load_model(name)
    serving = c.model_info(name).version if moved else "?"
    print(f"tritonbundle load: {name}: the server refused version(s) {', '.join(sorted(refused)) or '?'} "
          f"({str(error).splitlines()[0]}); moved to {', '.join(map(str, moved)) or 'nothing (not found)'}; "
          f"serving version {serving}", file=sys.stderr)


def cmd_health(args: argparse.Namespace) -> int:
    with client(args, check_model=False, fail_fast=True) as c:
        health: dict[str, object] = {**c.health(), "url": url(args)}
    if not health["live"]:
        print(json.dumps(health))
        print(f"tritonbundle health: no server answers at {url(args)} over {args.protocol}; is `tritonbundle serve` "
              f"running there? (--url, ${defaults.URL_ENV})", file=sys.stderr)
        return 1
    if args.canary:
        from tritonbundle.canary import Canary, served_models

        if args.protocol != "http":
            raise ConfigError("--canary sends its requests over HTTP: pass the HTTP address")
        models = served_models(args.repository) if args.repository else [args.model]
        problems = Canary(f"http://{url(args)}", models, timeout_s=args.timeout_s, metrics_url=args.metrics_url).check()
        health["answers"] = not any(p.fatal for p in problems)
        health["problems"] = [str(p) for p in problems]
    print(json.dumps(health))
    return 0 if health["live"] and health["ready"] and health.get("answers", True) else 1


def cmd_models(args: argparse.Namespace) -> int:
    try:
        with client(args, check_model=False, fail_fast=True) as c:
            models = c.models()
    except ServerUnavailableError as e:
        raise unreachable(args, e) from e
    except UnauthorizedError as e:
        raise locked(args) from e
    if args.json:
        print(json.dumps(models, indent=2))
        return 0
    print(f"{'model':<24} {'version':<8} {'state':<12} {'max batch':<10} {'batching'}")
    for m in models:
        print(f"{m['name']:<24} {m.get('version') or '-':<8} {m.get('state') or '-':<12} "
              f"{m.get('max_batch_size', '-')!s:<10} {m.get('batching', '-')}")
    return 0


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = shared.parser(sub, "infer", help="call a model as its task says: texts (arguments, or one per line on stdin) "
                                     "to a text model, tensors to a tensor model; prints JSON")
    shared.server(p)
    p.add_argument("texts", nargs="*", help="texts for a text model (one per line on stdin when none)")
    p.add_argument("--compact", action="store_true", help="text-embedding: print only the embeddings")
    p.add_argument("--query", help="text-pair: the query each text is scored against")
    p.add_argument("--input", action="append", metavar="NAME=FILE",
                   help="tensor model: an input from a .npy or .json file (repeatable)")
    p.add_argument("--inputs", type=Path, metavar="FILE.npz", help="tensor model: every input from one .npz")
    p.add_argument("--random", action="store_true",
                   help="tensor model: random data of the declared shapes for inputs not given (batch 1, each "
                        "dynamic axis at the plan's typical size)")
    p.add_argument("--shape", action="append", metavar="NAME=DIMS",
                   help="with --random: this input's full shape, batch included (pixels=1x3x224x224)")
    p.add_argument("--seed", type=int, default=0, help="with --random")
    p.add_argument("--out", type=Path, metavar="FILE.npz", help="tensor model: save the outputs there instead of printing them")
    p.set_defaults(func=cmd_infer)

    for verb, text in (("load", "load (or reload, picking up a new version) models; needs explicit model control "
                                "and the API key"), ("unload", "unload models; needs explicit model control and the API key")):
        p = shared.parser(sub, verb, help=text)
        shared.server(p)
        p.add_argument("names", nargs="+", metavar="MODEL")
        if verb == "load":
            p.add_argument("--repository", type=Path,
                           help="the server's repository folder: a version the server refuses is moved out of it "
                                "(to <repository>.quarantine/, with its error) and the model is loaded again")
        p.set_defaults(func=cmd_load)

    p = shared.parser(sub, "health", help="server liveness and readiness (--canary: and that the models answer)")
    shared.server(p)
    p.add_argument("--canary", action="store_true",
                   help="also send the smallest real request to --model (or every model of --repository): "
                        "Triton 2.51 says ready while a model's Python stub is dead")
    p.add_argument("--repository", type=Path, help="with --canary: probe every model of this repository folder")
    p.add_argument("--metrics-url", help="with --canary: Triton's metrics (http://127.0.0.1:8002/metrics), which tell a "
                                         "hung server (no inference completes, requests pending) from a busy one")
    p.set_defaults(func=cmd_health)

    p = shared.parser(sub, "models", help="models in the repository: versions, states, batching")
    shared.server(p)
    p.add_argument("--json", action="store_true")
    p.set_defaults(func=cmd_models)
