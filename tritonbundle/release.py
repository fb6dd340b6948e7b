"""``tritonbundle release``: a new version of a text model's encoder, released inside one running server.

The server runs with explicit model control (``serve --model-control-mode explicit``) and the key of its
restricted APIs. For the text model ``<name>`` (the tokenizer + encoder ensemble) and its encoder's new
version folder N+1 in the repository:

1. the encoder is reloaded serving N alone, then the ensemble with its encoder step pinned to N, so callers
   stay on N (in that order: loading an ensemble reloads a composing model whose folder changed since its
   last load from its config.pbtxt, which would serve the newest version, N+1, alone);
2. the encoder is reloaded serving N and N+1 side by side (``version_policy: specific``);
3. texts of the traffic sample's lengths are tokenized by the server's tokenizer and sent to both versions in
   turn, one text a call (the latencies, p99) and, once, in batches of mixed lengths (padded to the batch's
   longest, as the dynamic batcher's calls are): the answers are compared (cosine of each row's pair);
4. **promote** when every cosine is at least ``min_cosine`` and N+1's p99 is within ``max_p99_ratio`` of
   N's: the ensemble moves to N+1, then the encoder serves N+1 alone; **refuse** otherwise: the encoder
   serves N alone again. Either way the ensemble ends unpinned (its latest version), and a report says why.

Every step is a reload through Triton's repository API with a configuration override (the model's own
configuration with one field changed): Triton loads the new configuration before it lets the old one go,
and requests in flight finish where they started, so callers see no failure (tested under load).
"""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from tritonbundle.contract import (
    PIN_SETTLE_S,
    QUERY_INPUT,
    RESTRICTED_HEADER,
    TEXT_INPUT,
    encoder_name,
    encoder_pin,
    tokenizer_name,
)
from tritonbundle.errors import ClientError, ConfigError, TritonBundleError
from tritonbundle.server import refused_versions

#: Seconds a load may take before the command gives up on it: a TensorRT engine warming every profile up
#: takes minutes, and a load given up on by the client goes on in the server (Triton does not serialise
#: loads of one model), so the restore could race it.
LOAD_TIMEOUT_S = 900.0

#: Texts per call of the comparison's batched pass (fewer where the tokenizer or the encoder takes fewer).
BATCH = 8

#: What to do after a release stopped between its loads: the next one reads the ensemble's pin.
RUN_AGAIN = ("run the same `tritonbundle release` again: it reads the ensemble's pin and finishes or undoes "
             "this one")


class ReleaseError(ClientError):
    """The server failed a step of the release (a load, the restore): exit 3, apart from a refusal's 1."""

    exit_code = 3


class ReleaseInterrupted(TritonBundleError):
    """Ctrl-C: during the comparison, after the serving version is restored; during a load, with nothing
    restored (the load goes on in the server, and a restore would race it: Triton does not serialise loads
    of one model)."""

    exit_code = 130


class CandidateFault(ValueError):
    """The candidate's answers cannot be compared: another shape, values that are not finite."""


@dataclass
class Verdict:
    model: str
    encoder: str
    serving: int
    candidate: int
    promoted: bool
    reason: str
    #: Whether the refusal is the candidate's doing (its answers, its latency, the server refusing to load
    #: it), not the environment's (a timeout, the serving version's answers): only then is it quarantined.
    candidate_at_fault: bool = False
    texts: int = 0
    batch: int = 1
    min_cosine: float = 0.0
    p99_ms: dict[str, float] = field(default_factory=dict)
    p50_ms: dict[str, float] = field(default_factory=dict)
    steps: list[str] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


class Release:
    """One release of ``model``'s encoder from the serving version to ``candidate`` (module docstring)."""

    def __init__(self, url: str, model: str, candidate: int, *, api_key: str | None, timeout_s: float = 120.0) -> None:
        import tritonclient.http as httpclient

        self.url = url.removeprefix("http://")
        self.client = httpclient.InferenceServerClient(self.url, network_timeout=timeout_s, connection_timeout=timeout_s)
        self.loader = httpclient.InferenceServerClient(self.url, network_timeout=max(timeout_s, LOAD_TIMEOUT_S),
                                                       connection_timeout=timeout_s)
        self.model, self.candidate = model, candidate
        self.headers = {RESTRICTED_HEADER: api_key} if api_key else {}
        self.log: list[str] = []
        #: Versions an earlier release, stopped midway, left serving beside the pinned one (never promoted).
        self.left_over: list[int] = []

    # -- the server ------------------------------------------------------------------------------------
    def _config(self, name: str) -> dict[str, Any]:
        config: dict[str, Any] = self.client.get_model_config(name)
        return config

    def _load(self, name: str, config: dict[str, Any], what: str) -> None:
        started = time.monotonic()
        try:
            self.loader.load_model(name, headers=self.headers, config=json.dumps(config))
        except Exception as e:  # noqa: BLE001 - tritonclient's own error: said in one line
            raise ReleaseError(f"release of {self.model!r}: {what} failed: {e}", model=name, protocol="http") from e
        self.log.append(f"{what} ({time.monotonic() - started:.1f} s)")

    def _settle(self) -> None:
        """Wait until callers of the encoder itself have read the ensemble's new pin (contract.PIN_SETTLE_S)."""
        time.sleep(PIN_SETTLE_S)

    def _steps(self) -> tuple[dict[str, Any], int, str, str]:
        """The ensemble's configuration, its encoder step's index, the tokenizer's and the encoder's names
        (by name: a classifier's ensemble ends with its post-processing model, not the encoder)."""
        ensemble = self._config(self.model)
        steps = (ensemble.get("ensemble_scheduling") or {}).get("step") or []
        names = [str(s.get("model_name")) for s in steps]
        encoder, tokenizer = encoder_name(self.model), tokenizer_name(self.model)
        if ensemble.get("platform") != "ensemble" or encoder not in names or tokenizer not in names:
            raise ConfigError(f"model {self.model!r} is not a tokenizer + encoder ensemble ({tokenizer}, {encoder}): "
                              "release works on the text models the build stage writes")
        if any(i.get("name") == QUERY_INPUT for i in ensemble.get("input", [])):
            raise ConfigError(f"model {self.model!r} takes query and text pairs: release compares text-embedding "
                              "and text-classification models only")
        for name in (tokenizer, encoder):
            if int(self._config(name).get("max_batch_size") or 0) < 1:
                raise ConfigError(f"model {name!r} has no batch dimension (max_batch_size 0): release compares "
                                  "the batched text models the build stage writes")
        return ensemble, names.index(encoder), tokenizer, encoder

    def _serving(self, encoder: str, pinned: int) -> int:
        """The version callers get: the one the encoder serves or, when it serves several (a release killed
        during its comparison: N and N+1), the one the ensemble is still pinned to, not the newest; the
        others go to :attr:`left_over`."""
        versions = sorted(int(v) for v in self.client.get_model_metadata(encoder).get("versions", []))
        if not versions:
            raise ReleaseError(f"model {encoder!r} serves no version", model=encoder, protocol="http")
        if pinned != -1:
            self.log.append(f"an earlier release stopped midway: {encoder} serves versions {versions}, "
                            f"{self.model} is pinned to {pinned}")
        if len(versions) == 1:
            return versions[0]
        if pinned in versions:  # above the pin: a stopped release's candidate; below it, the version it replaced
            self.left_over = [v for v in versions if v > pinned and v != self.candidate]
            return pinned
        raise ConfigError(f"{encoder!r} serves versions {versions} at once and {self.model!r} is not pinned to "
                          f"either: which one should serve is not known. Move the version folder that should not "
                          f"serve out of the repository, then load {encoder!r} and {self.model!r} again "
                          "(tritonbundle load), and release again")

    # -- comparing ----------------------------------------------------------------------------------------
    def _tokens(self, tokenizer: str, texts: list[str]) -> dict[str, np.ndarray[Any, Any]]:
        import tritonclient.http as httpclient

        data = np.array([[t.encode()] for t in texts], dtype=object)
        tensor = httpclient.InferInput(TEXT_INPUT, list(data.shape), "BYTES")
        tensor.set_data_from_numpy(data)
        out = self.client.infer(tokenizer, [tensor])
        config = self._config(tokenizer)
        return {o["name"]: out.as_numpy(o["name"]) for o in config["output"] if o["name"] != "tokens"}

    def _embed(self, encoder: str, version: int, feeds: dict[str, np.ndarray[Any, Any]], output: str,
               ) -> tuple[np.ndarray[Any, Any], float]:
        import tritonclient.http as httpclient

        tensors = []
        for name, array in feeds.items():
            t = httpclient.InferInput(name, list(array.shape), "INT64")
            t.set_data_from_numpy(array.astype(np.int64))
            tensors.append(t)
        started = time.perf_counter()
        out = self.client.infer(encoder, tensors, model_version=str(version))
        return out.as_numpy(output), (time.perf_counter() - started) * 1000

    def batch_size(self, tokenizer: str, encoder: str, wanted: int) -> int:
        """``wanted``, or less where the tokenizer or the encoder takes fewer rows a call."""
        return max(1, min(wanted, *(int(self._config(m)["max_batch_size"]) for m in (tokenizer, encoder))))

    def _pair(self, tokenizer: str, encoder: str, serving: int, texts: list[str], output: str,
              ) -> tuple[float, float, float]:
        """``texts`` in one call to each version: the least cosine of a row's two answers, and each
        version's latency (ms). NaN compares false with everything, so its cosine would pass any gate:
        an answer that is not finite or of another shape raises, naming the version."""
        feeds = self._tokens(tokenizer, texts)
        old, t_old = self._embed(encoder, serving, feeds, output)
        new, t_new = self._embed(encoder, self.candidate, feeds, output)
        if new.shape != old.shape:
            raise CandidateFault(f"version {self.candidate} answers {output} of shape {list(new.shape)}, "
                                 f"version {serving} {list(old.shape)}")
        if not np.isfinite(new).all():
            raise CandidateFault(f"version {self.candidate} answers {output} with values that are not finite (NaN or inf)")
        if not np.isfinite(old).all():  # the serving one's: not the candidate's doing
            raise ValueError(f"version {serving} answers {output} with values that are not finite (NaN or inf)")
        a, b = old.reshape(len(old), -1), new.reshape(len(new), -1)
        norms = np.maximum(1e-12, np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
        return float(((a * b).sum(axis=1) / norms).min()), t_old, t_new

    def compare(self, tokenizer: str, encoder: str, serving: int, texts: list[str], rounds: int, batch: int = 1,
                ) -> tuple[float, dict[str, list[float]]]:
        """The least cosine between the two versions' answers, row by row, and each version's latencies.

        Each text alone, ``rounds`` times, interleaved (the latencies); in the first round the texts also
        go ``batch`` at a time, rows of mixed lengths padded to the call's longest as the dynamic batcher's
        calls are: a candidate wrong only for padded rows or larger batches fails there."""
        output = self._config(encoder)["output"][0]["name"]
        worst = 1.0
        times: dict[str, list[float]] = {str(serving): [], str(self.candidate): []}
        for r in range(rounds):
            for text in texts:
                cosine, t_old, t_new = self._pair(tokenizer, encoder, serving, [text], output)
                worst = min(worst, cosine) if r == 0 else worst
                times[str(serving)].append(t_old)
                times[str(self.candidate)].append(t_new)
            for start in range(0, len(texts), batch) if r == 0 and batch > 1 else ():
                worst = min(worst, self._pair(tokenizer, encoder, serving, texts[start:start + batch], output)[0])
        return worst, times

    # -- the release ---------------------------------------------------------------------------------------
    def run(self, texts: list[str], *, min_cosine: float = 0.999, max_p99_ratio: float = 1.5, slack_ms: float = 5.0,
            rounds: int = 3, batch: int = BATCH) -> Verdict:
        if not texts or rounds < 1:
            raise ConfigError(f"a release compares at least one text once (texts {len(texts)}, rounds {rounds})")
        ensemble, at, tokenizer, encoder = self._steps()
        pinned = encoder_pin(ensemble, encoder)
        serving = self._serving(encoder, pinned)  # a stopped release is restored by this one's first loads
        verdict = Verdict(self.model, encoder, serving, self.candidate, False, "",
                          batch=self.batch_size(tokenizer, encoder, batch))
        encoder_config = self._config(encoder)
        encoder_config.pop("version_policy", None)

        def pin(version: int) -> dict[str, Any]:
            config: dict[str, Any] = json.loads(json.dumps(ensemble))
            config["ensemble_scheduling"]["step"][at]["model_version"] = version
            return config

        def versions(*numbers: int) -> dict[str, Any]:
            return {**encoder_config, "version_policy": {"specific": {"versions": list(numbers)}}}

        def restore() -> None:
            self._load(encoder, versions(serving), f"{encoder} serves version {serving} alone again")
            self._load(self.model, pin(-1), f"unpinned {self.model}")

        if self.candidate == serving:
            if pinned != -1:  # the earlier release's end: the encoder serves its pinned version alone, unpinned
                restore()
            raise ConfigError(f"{encoder!r} already serves version {serving}"
                              + (" (restored: it serves that version alone again)" if pinned != -1 else ""))

        def refuse(reason: str, *, candidate_at_fault: bool) -> Verdict:
            try:
                restore()
            except ClientError as e:  # the server is gone too: say both, the refusal's reason first
                raise ReleaseError(f"release of {self.model!r} refused ({reason}), and restoring failed: {e}",
                                   model=encoder, protocol="http") from e
            verdict.reason, verdict.candidate_at_fault, verdict.steps = reason, candidate_at_fault, self.log
            return verdict

        try:
            # Loading an ensemble reloads a composing model whose folder changed since its last load, from
            # its config.pbtxt (which would serve the newest version alone): so the encoder is loaded first,
            # as it serves now, and only then is the ensemble pinned to it.
            self._load(encoder, versions(serving), f"{encoder} serves version {serving} (its repository read again)")
            self._load(self.model, pin(serving), f"pinned {self.model} to {encoder} version {serving}")
            self._settle()  # token-id calls (clients/pin.py) name the pinned version before N+1 loads
            try:
                self._load(encoder, versions(serving, self.candidate), f"loaded {encoder} version {self.candidate} beside {serving}")
            except ClientError as e:  # the server's own refusal of the version ("version N is at UNAVAILABLE
                # state: <why>"), or a timeout, a connection lost: only the first is the candidate's doing
                return refuse(f"version {self.candidate} did not load: {e}",
                              candidate_at_fault=str(self.candidate) in refused_versions(e))
            try:
                worst, times = self.compare(tokenizer, encoder, serving, texts, rounds, verdict.batch)
            except Exception as e:  # noqa: BLE001 - whatever stopped the comparison, the serving version is restored
                return refuse(f"the comparison failed: {type(e).__name__}: {e}",
                              candidate_at_fault=isinstance(e, CandidateFault))
            except KeyboardInterrupt:  # between two calls: the serving version serves alone again, then the end
                refuse("the release was interrupted", candidate_at_fault=False)
                raise ReleaseInterrupted(f"interrupted during the comparison; {encoder} serves version {serving} "
                                         f"alone again, {self.model} unpinned") from None
            verdict.texts, verdict.min_cosine = len(texts), round(worst, 6)
            verdict.p50_ms = {v: round(float(np.percentile(t, 50)), 2) for v, t in times.items()}
            verdict.p99_ms = {v: round(float(np.percentile(t, 99)), 2) for v, t in times.items()}
            old_p99, new_p99 = verdict.p99_ms[str(serving)], verdict.p99_ms[str(self.candidate)]
            if worst < min_cosine:
                return refuse(f"answers differ: least cosine {worst:.6f} < {min_cosine}", candidate_at_fault=True)
            if new_p99 > max_p99_ratio * old_p99 + slack_ms:
                return refuse(f"slower: p99 {new_p99:.1f} ms > {max_p99_ratio} x {old_p99:.1f} + {slack_ms} ms",
                              candidate_at_fault=True)
            verdict.promoted = True
            verdict.reason = f"answers agree (least cosine {worst:.6f}), p99 {new_p99:.1f} vs {old_p99:.1f} ms"
            self._load(self.model, pin(self.candidate), f"moved {self.model} to {encoder} version {self.candidate}")
            self._settle()  # ...and name N+1 before N unloads
            self._load(encoder, versions(self.candidate), f"{encoder} serves version {self.candidate} alone")
            self._load(self.model, pin(-1), f"unpinned {self.model}")
        except KeyboardInterrupt:  # during a load: it goes on in the server, so nothing is restored here
            raise ReleaseInterrupted(f"interrupted after: {self.log[-1] if self.log else 'nothing'}; "
                                     f"{RUN_AGAIN}") from None
        verdict.steps = self.log
        return verdict
