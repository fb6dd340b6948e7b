"""``tritonbundle release``: a new version of a text model's encoder, released inside one running server.

The server runs with explicit model control (``serve --model-control-mode explicit``) and the key of its
restricted APIs. For the text model ``<name>`` (the tokenizer + encoder ensemble) and its encoder's new
version folder N+1 in the repository:

1. the encoder is reloaded serving N alone, then the ensemble with its encoder step pinned to N, so callers
   stay on N (in that order: loading an ensemble reloads a composing model whose folder changed since its
   last load from its config.pbtxt, which would serve the newest version, N+1, alone);
2. the encoder is reloaded serving N and N+1 side by side (``version_policy: specific``);
3. texts of the traffic sample's lengths are tokenized by the server's tokenizer, in batches of mixed lengths
   (padded to the batch's longest, as the dynamic batcher's calls are), and sent to both versions in turn: the
   answers are compared (cosine of each row's pair) and so are the latencies (p99);
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

from tritonbundle.contract import QUERY_INPUT, RESTRICTED_HEADER, TEXT_INPUT, encoder_name, tokenizer_name
from tritonbundle.errors import ClientError, ConfigError

#: Seconds a load may take before the command gives up on it: a TensorRT engine warming every profile up
#: takes minutes, and a load given up on by the client goes on in the server (Triton does not serialise
#: loads of one model), so the restore could race it.
LOAD_TIMEOUT_S = 900.0

#: Texts per comparison call (fewer where the tokenizer or the encoder takes fewer rows a call).
BATCH = 8


@dataclass
class Verdict:
    model: str
    encoder: str
    serving: int
    candidate: int
    promoted: bool
    reason: str
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

    # -- the server ------------------------------------------------------------------------------------
    def _config(self, name: str) -> dict[str, Any]:
        config: dict[str, Any] = self.client.get_model_config(name)
        return config

    def _load(self, name: str, config: dict[str, Any], what: str) -> None:
        started = time.monotonic()
        try:
            self.loader.load_model(name, headers=self.headers, config=json.dumps(config))
        except Exception as e:  # noqa: BLE001 - tritonclient's own error: said in one line
            raise ClientError(f"release of {self.model!r}: {what} failed: {e}", model=name, protocol="http") from e
        self.log.append(f"{what} ({time.monotonic() - started:.1f} s)")

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
        return ensemble, names.index(encoder), tokenizer, encoder

    def _serving(self, encoder: str, pinned: int) -> tuple[int, bool]:
        """The version callers get, and whether an earlier release stopped midway: the one the encoder
        serves or, when it serves several (a release killed during the comparison: N and N+1), the one the
        ensemble is still pinned to, not the newest."""
        versions = sorted(int(v) for v in self.client.get_model_metadata(encoder).get("versions", []))
        if not versions:
            raise ClientError(f"model {encoder!r} serves no version", model=encoder, protocol="http")
        if len(versions) == 1:
            return versions[0], False
        if pinned in versions:
            self.log.append(f"an earlier release stopped midway: {encoder} serves versions {versions}, "
                            f"{self.model} is pinned to {pinned}, which is taken for the serving one")
            return pinned, True
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
        limits = [int(self._config(m).get("max_batch_size") or 1) for m in (tokenizer, encoder)]
        return max(1, min(wanted, *limits))

    def compare(self, tokenizer: str, encoder: str, serving: int, texts: list[str], rounds: int, batch: int = 1,
                ) -> tuple[float, dict[str, list[float]]]:
        """The least cosine between the two versions' answers, row by row, and each version's latencies per
        call (interleaved), the texts sent ``batch`` at a time.

        A candidate whose answer cannot be compared (another shape, a value that is not finite) raises
        ``ValueError`` naming it: NaN compares false with everything, so its cosine would pass any gate."""
        output = self._config(encoder)["output"][0]["name"]
        worst = 1.0
        times: dict[str, list[float]] = {str(serving): [], str(self.candidate): []}
        for r in range(rounds):
            for start in range(0, len(texts), batch):
                feeds = self._tokens(tokenizer, texts[start:start + batch])
                old, t_old = self._embed(encoder, serving, feeds, output)
                new, t_new = self._embed(encoder, self.candidate, feeds, output)
                if new.shape != old.shape:
                    raise ValueError(f"version {self.candidate} answers {output} of shape {list(new.shape)}, "
                                     f"version {serving} {list(old.shape)}")
                for version, answer in ((self.candidate, new), (serving, old)):
                    if not np.isfinite(answer).all():  # the serving one's too: NaN would drop out of the cosine
                        raise ValueError(f"version {version} answers {output} with values that are not finite "
                                         "(NaN or inf)")
                if r == 0:
                    a, b = old.reshape(len(old), -1), new.reshape(len(new), -1)
                    norms = np.maximum(1e-12, np.linalg.norm(a, axis=1) * np.linalg.norm(b, axis=1))
                    worst = min(worst, float(((a * b).sum(axis=1) / norms).min()))
                times[str(serving)].append(t_old)
                times[str(self.candidate)].append(t_new)
        return worst, times

    # -- the release ---------------------------------------------------------------------------------------
    def run(self, texts: list[str], *, min_cosine: float = 0.999, max_p99_ratio: float = 1.5, slack_ms: float = 5.0,
            rounds: int = 3, batch: int = BATCH) -> Verdict:
        if not texts or rounds < 1:
            raise ConfigError(f"a release compares at least one text once (texts {len(texts)}, rounds {rounds})")
        ensemble, at, tokenizer, encoder = self._steps()
        # (an earlier release stopped midway is restored by this one's first loads, whatever it then does)
        serving, stopped = self._serving(encoder, int(ensemble["ensemble_scheduling"]["step"][at].get("model_version", -1)))
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

        if self.candidate == serving:
            if stopped:  # the earlier release's end: the encoder serves its pinned version alone, unpinned
                self._load(encoder, versions(serving), f"{encoder} serves version {serving} alone again")
                self._load(self.model, pin(-1), f"unpinned {self.model}")
            raise ConfigError(f"{encoder!r} already serves version {serving}"
                              + (" (restored: it serves that version alone again)" if stopped else ""))

        def refuse(reason: str) -> Verdict:
            try:
                self._load(encoder, versions(serving), f"{encoder} serves version {serving} alone again")
                self._load(self.model, pin(-1), f"unpinned {self.model}")
            except ClientError as e:  # the server is gone too: say both, the refusal's reason first
                raise ClientError(f"release of {self.model!r} refused ({reason}), and restoring failed: {e}",
                                  model=encoder, protocol="http") from e
            verdict.reason, verdict.steps = reason, self.log
            return verdict

        # Loading an ensemble reloads a composing model whose folder changed since its last load, from its
        # config.pbtxt (which would serve the newest version alone): so the encoder is loaded first, as it
        # serves now, and only then is the ensemble pinned to it.
        self._load(encoder, versions(serving), f"{encoder} serves version {serving} (its repository read again)")
        self._load(self.model, pin(serving), f"pinned {self.model} to {encoder} version {serving}")
        try:
            self._load(encoder, versions(serving, self.candidate), f"loaded {encoder} version {self.candidate} beside {serving}")
        except ClientError as e:
            return refuse(f"version {self.candidate} did not load: {e}")
        try:
            worst, times = self.compare(tokenizer, encoder, serving, texts, rounds, verdict.batch)
        except Exception as e:  # noqa: BLE001 - whatever stopped the comparison, the serving version is restored
            return refuse(f"the comparison failed: {type(e).__name__}: {e}")
        except BaseException:  # Ctrl-C: the serving version serves alone again before the command ends
            refuse("the release was interrupted")
            raise
        verdict.texts, verdict.min_cosine = len(texts), round(worst, 6)
        verdict.p50_ms = {v: round(float(np.percentile(t, 50)), 2) for v, t in times.items()}
        verdict.p99_ms = {v: round(float(np.percentile(t, 99)), 2) for v, t in times.items()}
        old_p99, new_p99 = verdict.p99_ms[str(serving)], verdict.p99_ms[str(self.candidate)]
        if worst < min_cosine:
            return refuse(f"answers differ: least cosine {worst:.6f} < {min_cosine}")
        if new_p99 > max_p99_ratio * old_p99 + slack_ms:
            return refuse(f"slower: p99 {new_p99:.1f} ms > {max_p99_ratio} x {old_p99:.1f} + {slack_ms} ms")
        verdict.promoted = True
        verdict.reason = f"answers agree (least cosine {worst:.6f}), p99 {new_p99:.1f} vs {old_p99:.1f} ms"
        self._load(self.model, pin(self.candidate), f"moved {self.model} to {encoder} version {self.candidate}")
        self._load(encoder, versions(self.candidate), f"{encoder} serves version {self.candidate} alone")
        self._load(self.model, pin(-1), f"unpinned {self.model}")
        verdict.steps = self.log
        return verdict
