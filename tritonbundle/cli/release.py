"""``tritonbundle release``: release a new version of a text model's encoder inside one running server
(compare it with the serving version on texts of the traffic sample's lengths, then promote or refuse it)."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tritonbundle.cli import args as shared
from tritonbundle.cli import defaults
from tritonbundle.contract import encoder_name
from tritonbundle.errors import ConfigError
from tritonbundle.release import BATCH


def cmd_release(args: argparse.Namespace) -> int:
    from tritonbundle import traffic
    from tritonbundle.payloads import PayloadFactory
    from tritonbundle.release import Release

    if args.protocol != "http":
        raise ConfigError("release speaks HTTP (Triton's repository API and model versions): give the HTTP "
                          "address (--url host:8000), not --protocol grpc")
    url = shared.url(args)
    candidate = None if args.repository is None else args.repository / encoder_name(args.model) / str(args.version)
    if candidate is not None and not candidate.is_dir():  # before any load: a wrong path would quarantine nothing
        raise ConfigError(f"--repository {args.repository}: no folder {candidate} (the encoder's version "
                          f"{args.version}); give the server's repository as this machine sees it")
    factory = PayloadFactory(traffic.load(args.traffic), seed=0, max_batch=1)
    texts = [factory.text(factory.draw()[0]) for _ in range(args.texts)]
    release = Release(url, args.model, args.version, api_key=shared.read_key(args, url.removeprefix("http://")),
                      timeout_s=args.timeout_s)
    try:
        verdict = release.run(texts, min_cosine=args.min_cosine, max_p99_ratio=args.max_p99_ratio,
                              rounds=args.rounds, batch=args.batch)
    finally:  # versions a stopped release left serving were never promoted: out too, whatever this one did
        for version in release.left_over:
            _move_out(args.repository, encoder_name(args.model), version,
                      "a release stopped midway left it serving beside the pinned version; it was never promoted")
    if args.report:
        Path(args.report).write_text(json.dumps(verdict.to_json(), indent=2))
    for line in verdict.steps:
        print(f"  {line}")
    word = "PROMOTED" if verdict.promoted else "REFUSED"
    print(f"{word}: {verdict.encoder} version {verdict.candidate} (serving {verdict.serving}): {verdict.reason}")
    if not verdict.promoted and verdict.candidate_at_fault:
        _move_out(args.repository, verdict.encoder, verdict.candidate, f"tritonbundle release refused it: {verdict.reason}")
    elif not verdict.promoted:
        print(f"  version {verdict.candidate} stays in the repository (not its own doing: release it again)")
    return 0 if verdict.promoted else 1


def _move_out(repository: Path | None, encoder: str, version: int, reason: str) -> None:
    """Move a version that must not serve out of ``repository`` (with ``reason``), or say it stays."""
    from tritonbundle.server import quarantine

    if repository is None or not (repository / encoder / str(version)).is_dir():
        print(f"  version {version} ({reason}) stays in the repository: move it out (or give --repository), or a "
              "restart (latest version) would serve it", file=sys.stderr)
        return
    try:
        print(f"  moved version {version} out of the repository: {quarantine(repository, encoder, str(version), reason)}")
    except OSError as e:  # e.g. files the server's container owns: the verdict stands, the move is the user's
        print(f"  could not move {repository / encoder / str(version)} out of the repository ({e}): move it out, or a restart (latest version) "
              "would serve it", file=sys.stderr)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    p = shared.parser(sub, "release", help="compare a new encoder version with the serving one inside the server, then "
                                           "promote or refuse it (explicit model control)")
    shared.server(p)
    p.add_argument("--version", type=int, required=True, help="the encoder's new version (its folder in the repository)")
    p.add_argument("--traffic", type=Path, default=defaults.TRAFFIC, help="texts to compare on are drawn from this sample")
    p.add_argument("--texts", type=shared.above(0, whole=True), default=50, help="how many texts")
    p.add_argument("--rounds", type=shared.above(0, whole=True), default=3,
                   help="times each text is sent to each version (latency)")
    p.add_argument("--batch", type=shared.above(0, whole=True), default=BATCH,
                   help="texts per call, of mixed lengths padded to the longest (at most the models' max_batch_size)")
    p.add_argument("--min-cosine", type=shared.above(0), default=0.999, help="least cosine between the versions' answers")
    p.add_argument("--max-p99-ratio", type=shared.above(0), default=1.5,
                   help="new p99 at most this times the serving one (+5 ms)")
    p.add_argument("--report", help="write the verdict as JSON here")
    p.add_argument("--repository", type=Path,
                   help="the server's repository folder: a refused version is moved out of it (to "
                        "<repository>.quarantine/, with the reason), so a restart does not serve it")
    p.set_defaults(func=cmd_release)
