#!/usr/bin/env python3
"""The edge's request limits, derived from what the build wrote: a model repository's config.pbtxt files.

    python3 docker/edge/limits.py model_repository            # the figures, per model, and the settings
    python3 docker/edge/limits.py --capacity model_repository # the capacity alone (the edge's entry point)
    python3 docker/edge/limits.py --json model_repository     # everything as JSON (tests)

The capacity is how many inference requests Triton can hold at once without refusing one for a full queue:

    hold(model)    = max_queue_size                      (however the dynamic batcher batches, requests at
                                                          the model never outnumber its queue's bound)
    hold(ensemble) = min(hold(step) for each step)       (a pipeline holds no more than its narrowest step)
    capacity       = sum(hold(model) - reserve for each user-facing model: those no ensemble calls as a step)

reserve (--reserve, 2): room for the health checks' canary requests, which call every model (the steps too)
beside the edge, one request at a time per canary: `tritonbundle serve`'s own and the orchestrator's health
check. For the bundle's minilm: tokenizer 128, encoder 64, so the ensemble holds 64 and the capacity is 62:
about two full batches of 32 waiting (the bundle's `max_queue_size: auto`), enough to keep every batch full.

Why the queue's bound and no more: the dynamic batcher executes a preferred batch as soon as one is ready (8
rows here, or fewer after max_queue_delay) and the requests behind it wait in the queue, so only the queue's
bound is sure. Measured at 10 times the capacity through the edge (Triton 2.51, the compose CPU stack, 640
callers from 10 addresses, 10-15 s runs; docker/README.md, "The edge"):
    instances x max_batch_size + max_queue_size (96): Triton refused 1,198 requests with "Exceeds maximum
        queue size", after its tokenizer had worked on them (1,825 tokenized for 375 answered);
    max_queue_size + instances (65): 30 refused;
    max_queue_size (64): 6 to 42 refused, all for the canaries (none with them off: 3,862 answered, 3,862
        tokenized);
    max_queue_size - 2 (62): none in four runs (2,280 to 3,042 answered, each tokenized once).
The edge lets at most `capacity` inference requests per protocol reach Triton (nginx upstream max_conns), and
by default
    client requests = ceil(capacity / 2)   per client address: one client never holds all of Triton;
    requests        = 2 x capacity         in all at the edge (HTTP and gRPC together, bodies still arriving
                                           included): Triton full, and as many again being read or answered.
A queue without a bound (max_queue_size 0, or no dynamic batcher) counts as the bundle's `auto`: two full
batches per instance (instance_group counts; KIND_GPU groups without `gpus` once per GPU: --gpus, default
1; no instance_group: one instance). A request is counted, not its rows: a request of 32 rows holds one
place in a queue, as in Triton.

Standard library only, and only what Debian's python3-minimal has (the edge image's Python): no json at import.
"""

from __future__ import annotations

import argparse
import math
import re
import sys
from pathlib import Path

#: The edge's capacity when no repository can be read (the bundle's minilm, above); docker/edge/entrypoint.sh
#: and the Helm chart's edge.limits.capacity use the same default.
DEFAULT_CAPACITY = 62
#: Room left at each user-facing model for the health checks' canary requests (above).
RESERVE = 2

_TOKEN = re.compile(r"""\s+|\#[^\n]*|(?P<str>"(?:[^"\\]|\\.)*"|'(?:[^'\\]|\\.)*')|(?P<punct>[{}<>\[\]:,;])|(?P<word>[^\s{}<>\[\]:,;"'\#]+)""")


class ConfigError(ValueError):
    """A config.pbtxt this script cannot read, or a repository without models."""


def _tokens(text: str, where: str) -> list[str]:
    out, pos = [], 0
    while pos < len(text):
        m = _TOKEN.match(text, pos)
        if m is None:
            raise ConfigError(f"{where}: cannot read the text at offset {pos}: {text[pos:pos + 20]!r}")
        pos = m.end()
        if m.group("str") is not None:
            out.append(m.group("str"))
        elif m.group("punct") is not None:
            out.append(m.group("punct"))
        elif m.group("word") is not None:
            out.append(m.group("word"))
    return out


def parse_pbtxt(text: str, where: str = "config.pbtxt") -> dict[str, list]:
    """Protobuf text format as nested dicts: each field name -> the list of its values (a message is a dict,
    a scalar the token's text with string quotes removed). Enough of the format for Triton's model configs."""
    tokens = _tokens(text, where)
    pos = 0

    def scalar(token: str) -> str:
        if token[:1] in "\"'":
            return token[1:-1].encode().decode("unicode_escape")
        return token

    def message(end: str | None) -> dict[str, list]:
        nonlocal pos
        fields: dict[str, list] = {}
        while pos < len(tokens):
            token = tokens[pos]
            if token == end:
                pos += 1
                return fields
            if token in (",", ";"):
                pos += 1
                continue
            name = token
            pos += 1
            if pos < len(tokens) and tokens[pos] == ":":
                pos += 1
            if pos >= len(tokens):
                break
            value = tokens[pos]
            if value in ("{", "<"):
                pos += 1
                fields.setdefault(name, []).append(message("}" if value == "{" else ">"))
            elif value == "[":
                pos += 1
                while pos < len(tokens) and tokens[pos] != "]":
                    if tokens[pos] == ",":
                        pos += 1
                    elif tokens[pos] in ("{", "<"):
                        opened = tokens[pos]
                        pos += 1
                        fields.setdefault(name, []).append(message("}" if opened == "{" else ">"))
                    else:
                        fields.setdefault(name, []).append(scalar(tokens[pos]))
                        pos += 1
                pos += 1
            else:
                pos += 1
                fields.setdefault(name, []).append(scalar(value))
        if end is not None:
            raise ConfigError(f"{where}: unbalanced braces (expected {end!r})")
        return fields

    return message(None)


def _one(fields: dict[str, list], name: str, default: object = None) -> object:
    values = fields.get(name)
    return values[-1] if values else default


def _int(fields: dict[str, list], name: str, default: int, where: str) -> int:
    value = _one(fields, name)
    if value is None:
        return default
    try:
        return int(str(value))
    except ValueError:
        raise ConfigError(f"{where}: {name} is {value!r}, not an integer") from None


class Model:
    """The parts of one model's config.pbtxt that say how many requests it holds."""

    def __init__(self, name: str, config: dict[str, list], where: str, *, gpus: int) -> None:
        self.name = name
        self.where = where
        self.platform = str(_one(config, "platform", "") or "")
        self.steps = [str(_one(step, "model_name", "")) for scheduling in config.get("ensemble_scheduling", [])
                      for step in scheduling.get("step", [])]
        self.max_batch_size = _int(config, "max_batch_size", 0, where)
        groups = config.get("instance_group", [])
        self.instances = 0
        for group in groups:
            count = _int(group, "count", 1, where)
            devices = len(group.get("gpus", []))
            kind = str(_one(group, "kind", "KIND_AUTO"))
            self.instances += count * (devices or (gpus if kind == "KIND_GPU" else 1))
        if not groups:
            self.instances = 1
        batching = config.get("dynamic_batching", [])
        self.dynamic_batching = bool(batching)
        policy = _one(batching[-1], "default_queue_policy", {}) if batching else {}
        self.max_queue_size = _int(policy, "max_queue_size", 0, where) if isinstance(policy, dict) else 0

    @property
    def is_ensemble(self) -> bool:
        return self.platform == "ensemble" or bool(self.steps)

    def own_hold(self) -> tuple[int, str]:
        if self.max_queue_size > 0:
            return self.max_queue_size, f"max_queue_size {self.max_queue_size}"
        queue = 2 * self.instances * (max(self.max_batch_size, 1) if self.dynamic_batching else 1)
        instances = f"{self.instances} instance{'' if self.instances == 1 else 's'}"
        return queue, f"queue unbounded: two full batches per instance, {instances}: {queue}"


def read_repository(repository: Path, *, gpus: int = 1) -> dict[str, Model]:
    if not repository.is_dir():
        raise ConfigError(f"{repository} is not a folder (a model repository: <model>/config.pbtxt)")
    models = {}
    for path in sorted(repository.glob("*/config.pbtxt")):
        config = parse_pbtxt(path.read_text(encoding="utf-8"), str(path))
        name = str(_one(config, "name", "") or path.parent.name)
        models[name] = Model(name, config, str(path), gpus=gpus)
    if not models:
        raise ConfigError(f"{repository} holds no <model>/config.pbtxt")
    return models


def holds(models: dict[str, Model]) -> dict[str, tuple[int, str]]:
    """Each model's hold and how it was found (ensembles: their narrowest step, nested ensembles included)."""
    found: dict[str, tuple[int, str]] = {}

    def hold(name: str, seen: tuple[str, ...]) -> int:
        if name in found:
            return found[name][0]
        if name in seen:
            raise ConfigError(f"ensemble {seen[0]!r} calls itself through {' -> '.join((*seen, name))}")
        model = models.get(name)
        if model is None:
            raise ConfigError(f"ensemble {seen[-1]!r} has a step {name!r} that the repository does not hold")
        if model.is_ensemble:
            if not model.steps:
                raise ConfigError(f"{model.where}: an ensemble without steps")
            step_holds = {step: hold(step, (*seen, name)) for step in model.steps}
            narrowest = min(step_holds, key=lambda s: step_holds[s])
            found[name] = (step_holds[narrowest], f"ensemble: its narrowest step, {narrowest} ({step_holds[narrowest]})")
        else:
            found[name] = model.own_hold()
        return found[name][0]

    for name in models:
        hold(name, ())
    return found


def user_facing(models: dict[str, Model]) -> list[str]:
    steps = {step for model in models.values() for step in model.steps}
    return [name for name in models if name not in steps]


def limits(repository: Path, *, gpus: int = 1, reserve: int = RESERVE) -> dict[str, object]:
    models = read_repository(repository, gpus=gpus)
    found = holds(models)
    front = user_facing(models)
    capacity = sum(max(1, found[name][0] - reserve) for name in front)
    return {
        "repository": str(repository),
        "models": {name: {"holds": found[name][0], "how": found[name][1], "user_facing": name in front}
                   for name in models},
        "reserve": reserve,
        "capacity": capacity,
        "client_requests": default_client_requests(capacity),
        "requests": default_requests(capacity),
    }


def default_client_requests(capacity: int) -> int:
    return max(1, math.ceil(capacity / 2))


def default_requests(capacity: int) -> int:
    return 2 * capacity


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("repository", type=Path, help="a model repository: <model>/config.pbtxt")
    ap.add_argument("--gpus", type=int, default=1, help="GPUs per server, for KIND_GPU groups without `gpus`")
    ap.add_argument("--reserve", type=int, default=RESERVE,
                    help=f"room left at each user-facing model for health-check requests (default {RESERVE})")
    out = ap.add_mutually_exclusive_group()
    out.add_argument("--capacity", action="store_true", help="print the capacity alone")
    out.add_argument("--json", action="store_true", help="print everything as JSON")
    args = ap.parse_args(argv)
    try:
        found = limits(args.repository, gpus=args.gpus, reserve=args.reserve)
    except (ConfigError, OSError, UnicodeDecodeError) as e:
        print(f"limits.py: {e}", file=sys.stderr)
        return 1
    if args.capacity:
        print(found["capacity"])
    elif args.json:
        import json

        print(json.dumps(found, indent=2))
    else:
        for name, model in found["models"].items():  # type: ignore[union-attr]
            print(f"{name}{'' if model['user_facing'] else ' (a step)'}: holds {model['holds']}: {model['how']}")
        capacity, client, total = found["capacity"], found["client_requests"], found["requests"]
        print(f"capacity {capacity} (the sum over the user-facing models, less {found['reserve']} each for health "
              f"checks); per client {client}, in all {total}\n")
        print(f"compose: TRITONBUNDLE_EDGE_CAPACITY={capacity} (the edge derives it itself from the repository "
              f"it mounts)\nHelm:    --set edge.limits.capacity={capacity}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
