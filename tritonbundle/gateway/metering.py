"""Metering: who used what, per tenant and model, as Prometheus metrics and as a usage log.

Every request the gateway answers on ``/v1/embeddings`` is one :class:`Usage` record: its tenant (``-``
without tenants, ``(unauthenticated)`` for a missing or unknown key), its model (a served model's name,
or ``-``: a name a caller sent is never a label), its outcome (``ok``, ``refused``: a limit or a key,
``invalid``: the caller's mistake, ``error``: the server's), the reason of a refusal, its texts and tokens
(the tokenizer's counts, from the model's ``tokens`` output) and its latency. The edge asks the gateway
about every KServe ``/v2`` inference request too (tenants on): those are ``admitted`` (no texts or tokens:
the answer goes from Triton to the caller past the gateway) or ``refused``.

- Prometheus (``--metrics-port``): ``tritonbundle_gateway_requests_total{tenant,model,outcome}``,
  ``..._texts_total``, ``..._tokens_total{tenant,model}``, ``..._refusals_total{tenant,model,reason}``,
  ``..._request_seconds`` (histogram, answered requests). Counters live in the process: a restart starts
  them at zero (Prometheus' ``increase()``/``rate()`` handle the reset; what happened after the last
  scrape before the restart is lost to Prometheus).
- The usage log (``--usage-log``): one JSON line per request, appended and flushed before the answer is
  sent, so a restart loses nothing already answered; ``tritonbundle usage`` reads it (:func:`report`).
  Requests with no valid key are counted in the metrics only (anyone can send them: each would be a
  line). Past ``max_bytes`` the log is moved to ``<log>.1`` (replacing the one before) and a new one
  begun: at most twice that on disk (the chart's volume holds both), ``<log>.1`` read first. Ship the
  log off the host before it is replaced, for billing over longer spans. A line that cannot be written
  (a full disk) is counted in ``tritonbundle_gateway_usage_log_errors_total`` and logged, and the request
  is answered: the log's failure costs the records, not the service (alert on the counter).
"""

from __future__ import annotations

import json
import math
import os
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

import numpy as np

from tritonbundle.log import LOG

ANONYMOUS = "-"
UNAUTHENTICATED = "(unauthenticated)"
OUTCOMES = ("ok", "admitted", "refused", "invalid", "error")
#: The usage log's size at which it is moved aside (``<log>.1``) and begun again: ~2.3 million lines.
USAGE_LOG_MAX_BYTES = 400 << 20
#: Seconds: the latency histogram's buckets (an embedding call takes milliseconds to a second).
BUCKETS = (0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1.0, 2.0, 5.0, 10.0)


@dataclass(frozen=True)
class Usage:
    time: float
    tenant: str
    model: str
    outcome: str
    status: int
    texts: int = 0
    tokens: int = 0
    latency_ms: float = 0.0
    reason: str = ""


class Meter:
    """Counts :class:`Usage` records into Prometheus metrics (own registry) and the usage log."""

    def __init__(self, usage_log: Path | str | None = None, max_bytes: int = USAGE_LOG_MAX_BYTES) -> None:
        from prometheus_client import CollectorRegistry, Counter, Histogram

        self.registry = CollectorRegistry()
        labels = ("tenant", "model")
        self.requests = Counter("tritonbundle_gateway_requests", "requests answered, by outcome",
                                (*labels, "outcome"), registry=self.registry)
        self.texts = Counter("tritonbundle_gateway_texts", "texts (or token rows) embedded", labels, registry=self.registry)
        self.tokens = Counter("tritonbundle_gateway_tokens", "tokens embedded (the tokenizer's counts)", labels,
                              registry=self.registry)
        self.refusals = Counter("tritonbundle_gateway_refusals", "requests refused, by reason", (*labels, "reason"),
                                registry=self.registry)
        self.latency = Histogram("tritonbundle_gateway_request_seconds", "latency of answered requests", labels,
                                 buckets=BUCKETS, registry=self.registry)
        self.log_errors = Counter("tritonbundle_gateway_usage_log_errors", "usage-log lines that could not be written",
                                  registry=self.registry)
        self._error_logged = -math.inf  # when a write error was last logged (one line a minute at most)
        self._log: TextIO | None = None
        self.path, self.max_bytes = (Path(usage_log) if usage_log is not None else None), max_bytes
        if self.path is not None:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._log = open(self.path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - open for the process's life

    def record(self, usage: Usage) -> None:
        self.requests.labels(usage.tenant, usage.model, usage.outcome).inc()
        if usage.outcome == "ok":
            self.texts.labels(usage.tenant, usage.model).inc(usage.texts)
            self.tokens.labels(usage.tenant, usage.model).inc(usage.tokens)
            self.latency.labels(usage.tenant, usage.model).observe(usage.latency_ms / 1000)
        elif usage.outcome == "refused":
            self.refusals.labels(usage.tenant, usage.model, usage.reason).inc()
        if self._log is not None and usage.tenant != UNAUTHENTICATED:
            try:
                self._log.write(json.dumps(asdict(usage), separators=(",", ":")) + "\n")
                if self._log.tell() >= self.max_bytes:
                    self._rotate()
            except (OSError, ValueError) as e:  # ENOSPC; a log _rotate could not reopen: still answered
                self.log_errors.inc()
                if time.monotonic() - self._error_logged >= 60:
                    self._error_logged = time.monotonic()
                    LOG.error("usage log %s: a line could not be written (%s); counting them in "
                              "tritonbundle_gateway_usage_log_errors_total", self.path, e)

    def _rotate(self) -> None:
        assert self._log is not None and self.path is not None
        self._log.close()
        try:
            os.replace(self.path, rotated(self.path))
        finally:  # moved aside or not, the log is open again (a failed move: the same file grows on)
            self._log = open(self.path, "a", buffering=1, encoding="utf-8")  # noqa: SIM115 - open for the process's life

    def serve(self, port: int, host: str) -> None:
        """``/metrics`` on its own port (a thread of this process)."""
        from prometheus_client import start_http_server

        start_http_server(port, addr=host, registry=self.registry)

    def close(self) -> None:
        if self._log is not None:
            self._log.flush()
            os.fsync(self._log.fileno())
            self._log.close()
            self._log = None


def rotated(path: Path) -> Path:
    """Where the usage log goes when it reaches its size (``<log>.1``)."""
    return path.with_name(path.name + ".1")


def read(path: Path | str, since: float | None = None, until: float | None = None) -> Iterator[Usage]:
    """The usage log's records in ``[since, until)`` (epoch seconds), the moved-aside ``<log>.1`` first
    when there is one; a torn line is skipped."""
    files = [f for f in (rotated(Path(path)), Path(path)) if f.exists() or f == Path(path)]
    for file in files:
        with open(file, encoding="utf-8") as f:
            for line in f:
                try:
                    record = Usage(**json.loads(line))
                except (ValueError, TypeError):
                    continue
                if (since is None or record.time >= since) and (until is None or record.time < until):
                    yield record


def report(records: Iterable[Usage]) -> list[dict[str, Any]]:
    """One row per (tenant, model): requests by outcome, refusals by reason, texts, tokens, latency."""
    rows: dict[tuple[str, str], dict[str, Any]] = {}
    latencies: dict[tuple[str, str], list[float]] = {}
    for r in records:
        row = rows.setdefault((r.tenant, r.model), {
            "tenant": r.tenant, "model": r.model, "requests": 0, **{o: 0 for o in OUTCOMES},
            "refusals": {}, "texts": 0, "tokens": 0, "first": r.time, "last": r.time})
        row["requests"] += 1
        row[r.outcome] = row.get(r.outcome, 0) + 1
        row["first"], row["last"] = min(row["first"], r.time), max(row["last"], r.time)
        if r.outcome == "ok":
            row["texts"] += r.texts
            row["tokens"] += r.tokens
            latencies.setdefault((r.tenant, r.model), []).append(r.latency_ms)
        elif r.outcome == "refused":
            row["refusals"][r.reason] = row["refusals"].get(r.reason, 0) + 1
    for k, row in rows.items():
        lat = latencies.get(k)
        row["p50_ms"] = round(float(np.percentile(lat, 50)), 2) if lat else None
        row["p99_ms"] = round(float(np.percentile(lat, 99)), 2) if lat else None
    return [rows[k] for k in sorted(rows)]


def format_report(rows: list[dict[str, Any]]) -> str:
    if not rows:
        return "no requests in this window"
    head = f"{'tenant':<20} {'model':<16} {'requests':>9} {'ok':>8} {'admitted':>8} {'refused':>8} {'invalid':>8} " \
           f"{'error':>7} {'texts':>9} {'tokens':>11} {'p50 ms':>8} {'p99 ms':>8}  refusals"
    lines = [head]
    for r in rows:
        refusals = ", ".join(f"{k} {v}" for k, v in sorted(r["refusals"].items())) or "-"
        lines.append(f"{r['tenant']:<20} {r['model']:<16} {r['requests']:>9} {r['ok']:>8} {r['admitted']:>8} {r['refused']:>8} "
                     f"{r['invalid']:>8} {r['error']:>7} {r['texts']:>9} {r['tokens']:>11} "
                     f"{_ms(r['p50_ms']):>8} {_ms(r['p99_ms']):>8}  {refusals}")
    return "\n".join(lines)


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.1f}"
