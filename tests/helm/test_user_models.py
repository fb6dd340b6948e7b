"""Your own model in the Helm chart (engineBuild.userModels): the rendered pod for each source, the values
schema and the chart's own checks refusing what cannot work, the fetch-models script run for real against
local stand-ins of an HTTP server and an S3 store, and engine-build.sh waiting for a manifest copied onto
the volume. No cluster: see tests/helm/test_chart.py, which also lints and validates ci/user-models-values.yaml
against the Kubernetes schemas with every other scenario."""

from __future__ import annotations

import hashlib
import http.server
import importlib.util
import io
import os
import subprocess
import sys
import tarfile
import threading
import time
import zipfile
from collections.abc import Callable, Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest

from tests.helm.test_chart import (
    CHART,
    FULLNAME,
    Obj,
    engine_build_env,
    helm,  # noqa: F401 - the session fixture
    objects,
    render,
    template,
    workload,
)

FETCH = CHART / "files" / "fetch-models.py"
ENGINE_BUILD = CHART / "files" / "engine-build.sh"
SCENARIO = "user-models-values.yaml"
VOLUME = "/var/lib/tritonbundle"
SECRET_KEY = "wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY"
MANIFEST = "version: 1\nmodels:\n  - name: classifier\n    source: {onnx: models/classifier.onnx}\n"


def _inits(docs: list[Obj]) -> dict[str, Obj]:
    return {c["name"]: c for c in workload(docs)["spec"]["template"]["spec"].get("initContainers", [])}


def _env(container: Obj) -> dict[str, Any]:
    return {e["name"]: e.get("value", e.get("valueFrom")) for e in container["env"]}


def _scripts(docs: list[Obj]) -> Obj:
    return next(c for c in objects(docs, "ConfigMap") if c["metadata"]["name"] == f"{FULLNAME}-scripts")


def _values(tmp_path: Path, text: str) -> str:
    path = tmp_path / "values.yaml"
    path.write_text(text)
    return str(path)


# -- the rendered pod ---------------------------------------------------------------------------------
def test_url_source_fetches_before_the_build_with_credentials_only_from_the_secret(helm: Path) -> None:  # noqa: F811
    docs = render(helm, SCENARIO)
    inits = _inits(docs)
    assert list(inits) == ["python-packages", "fetch-models", "engine-build"], "fetched before the build"
    fetch, build = inits["fetch-models"], inits["engine-build"]
    assert fetch["image"] == build["image"], "the build image (python3, no other image to mirror)"
    assert fetch["command"] == ["python3", "/opt/tritonbundle/scripts/fetch-models.py"]
    assert "nvidia.com/gpu" not in fetch["resources"].get("limits", {}), "a download needs no GPU"
    env = _env(fetch)
    assert env["TRITONBUNDLE_FETCH_URL"] == "s3://ml-models/classifier/classifier-2024-06-11.tar.gz"
    assert env["TRITONBUNDLE_FETCH_DEST"] == f"{VOLUME}/user-models"
    assert env["TRITONBUNDLE_FETCH_SHA256"] == "5d41f5a3e1b52e5a2c9d3e8c0a7b6f4e3d2c1b0a99887766554433221100ffee"
    assert (env["TRITONBUNDLE_FETCH_TIMEOUT_S"], env["TRITONBUNDLE_FETCH_MAX_BYTES"]) == ("600", "2Gi")
    assert env["TRITONBUNDLE_FETCH_S3_ENDPOINT"] == "https://minio.storage.svc.cluster.local:9000"
    secret_env = {name: value["secretKeyRef"] for name, value in env.items() if isinstance(value, dict)}
    assert set(secret_env) == {"AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN",
                               "TRITONBUNDLE_FETCH_AUTHORIZATION"}
    for ref in secret_env.values():
        assert ref["name"] == "classifier-models-s3" and ref["optional"] is True
    mounts = {m["name"]: m for m in fetch["volumeMounts"]}
    assert mounts["model-cache"]["mountPath"] == VOLUME and not mounts["model-cache"].get("readOnly")
    assert mounts["scripts"]["readOnly"] is True and mounts["tmp"]["mountPath"] == "/tmp"
    assert fetch["securityContext"]["readOnlyRootFilesystem"] is True and fetch["securityContext"]["runAsUser"] == 1000
    build_env = _env(build)
    assert build_env["TRITONBUNDLE_MANIFEST"] == f"{VOLUME}/user-models/models.yaml"
    assert (build_env["TRITONBUNDLE_USER_MODELS"], build_env["TRITONBUNDLE_MANIFEST_WAIT_S"]) == ("url", "0")
    assert _scripts(docs)["data"]["fetch-models.py"] == FETCH.read_text()
    assert not objects(docs, "Pod"), "tests.enabled: false renders no `helm test` pod"


def test_url_from_the_secret_and_a_size_in_bytes(helm: Path, tmp_path: Path) -> None:  # noqa: F811
    docs = render(helm, _values(tmp_path, (
        "engineBuild:\n  userModels:\n    source: url\n    path: models/team-a\n    manifest: build/models.yaml\n"
        "    url:\n      maxSize: 21474836480\n      credentials:\n        existingSecret: presigned\n"
        "        urlKey: link\n")))
    fetch = _inits(docs)["fetch-models"]
    env = _env(fetch)
    assert env["TRITONBUNDLE_FETCH_URL"] == {"secretKeyRef": {"name": "presigned", "key": "link"}}
    assert env["TRITONBUNDLE_FETCH_MAX_BYTES"] == "21474836480", "an integer, not 2.147483648e+10"
    assert env["TRITONBUNDLE_FETCH_DEST"] == f"{VOLUME}/models/team-a"
    assert env["TRITONBUNDLE_FETCH_MANIFEST"] == "build/models.yaml"
    assert _env(_inits(docs)["engine-build"])["TRITONBUNDLE_MANIFEST"] == f"{VOLUME}/models/team-a/build/models.yaml"


def test_pvc_source_reads_the_manifest_from_the_volume_and_waits_for_it(helm: Path) -> None:  # noqa: F811
    docs = render(helm, sets={"engineBuild.userModels.source": "pvc", "engineBuild.userModels.waitSeconds": "120",
                              "modelRepository.pvc.mountPath": "/cache/"})
    inits = _inits(docs)
    assert "fetch-models" not in inits
    env = _env(inits["engine-build"])
    assert env["TRITONBUNDLE_MANIFEST"] == "/cache/user-models/models.yaml"
    assert (env["TRITONBUNDLE_USER_MODELS"], env["TRITONBUNDLE_MANIFEST_WAIT_S"]) == ("pvc", "120")
    assert "fetch-models.py" not in _scripts(docs)["data"]


def test_without_user_models_the_build_images_manifest_is_built_as_before(helm: Path) -> None:  # noqa: F811
    docs = render(helm)
    env = _env(_inits(docs)["engine-build"])
    assert env["TRITONBUNDLE_MANIFEST"] == "/opt/tritonbundle/build/models.yaml"
    assert "TRITONBUNDLE_USER_MODELS" not in env and "fetch-models" not in _inits(docs)
    assert "fetch-models.py" not in _scripts(docs)["data"]
    assert len(objects(docs, "Pod")) == 1, "the `helm test` pod is on by default"


@pytest.mark.parametrize(("values", "named"), [
    ("engineBuild:\n  userModels:\n    source: s3\n", "/engineBuild/userModels/source"),
    ("engineBuild:\n  userModels:\n    path: ../etc\n", "/engineBuild/userModels/path"),
    ("engineBuild:\n  userModels:\n    path: /abs\n", "/engineBuild/userModels/path"),
    ("engineBuild:\n  userModels:\n    manifest: a/../../b.yaml\n", "/engineBuild/userModels/manifest"),
    ("engineBuild:\n  userModels:\n    waitSeconds: -1\n", "/engineBuild/userModels/waitSeconds"),
    ("engineBuild:\n  userModels:\n    url:\n      location: ftp://host/m.tgz\n", "/engineBuild/userModels/url/location"),
    ("engineBuild:\n  userModels:\n    url:\n      sha256: abc\n", "/engineBuild/userModels/url/sha256"),
    ("engineBuild:\n  userModels:\n    url:\n      timeoutSeconds: 0\n", "/engineBuild/userModels/url/timeoutSeconds"),
    ("engineBuild:\n  userModels:\n    url:\n      maxSize: 2GB\n", "/engineBuild/userModels/url/maxSize"),
    ("engineBuild:\n  userModels:\n    url:\n      s3Endpoint: minio:9000\n", "/engineBuild/userModels/url/s3Endpoint"),
    ("engineBuild:\n  userModels:\n    url:\n      credentials:\n        urlKey: ''\n",
     "/engineBuild/userModels/url/credentials/urlKey"),
    ("tests:\n  enabled: 'no'\n", "/tests/enabled"),
])
def test_schema_refuses_bad_user_model_values_and_names_the_key(helm: Path, tmp_path: Path, values: str,  # noqa: F811
                                                                named: str) -> None:
    result = template(helm, _values(tmp_path, values), check=False)
    assert result.returncode != 0 and f"'{named}'" in result.stderr, result.stderr


@pytest.mark.parametrize("values", [
    "engineBuild:\n  userModels:\n    sourc: url\n",
    "engineBuild:\n  userModels:\n    url:\n      checksum: abc\n",
    "engineBuild:\n  userModels:\n    url:\n      credentials:\n        password: x\n",
])
def test_schema_refuses_a_misspelt_user_models_key(helm: Path, tmp_path: Path, values: str) -> None:  # noqa: F811
    result = template(helm, _values(tmp_path, values), check=False)
    assert result.returncode != 0 and "additional properties" in result.stderr, result.stderr


@pytest.mark.parametrize(("sets", "message"), [
    ({"engineBuild.userModels.source": "url"}, "engineBuild.userModels.url.location"),
    ({"engineBuild.userModels.source": "pvc", "engineBuild.enabled": "false"}, "needs engineBuild.enabled=true"),
    ({"engineBuild.userModels.source": "pvc", "engineBuild.userModels.path": "engines/mine"}, "engines/"),
])
def test_chart_refuses_user_models_it_cannot_build_and_says_what_to_set(helm: Path, sets: dict[str, str],  # noqa: F811
                                                                       message: str) -> None:
    result = template(helm, sets=sets, check=False)
    assert result.returncode != 0 and message in result.stderr, result.stderr


# -- the fetch script, for real -----------------------------------------------------------------------
@pytest.fixture(scope="module")
def fetch_module() -> ModuleType:
    spec = importlib.util.spec_from_file_location("fetch_models", FETCH)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_s3_signature_is_aws_signature_version_4(fetch_module: ModuleType) -> None:
    """AWS's own example (S3 API reference, "Signature Calculations for the Authorization Header", GET Object)."""
    header = fetch_module.sigv4_authorization(
        method="GET", host="examplebucket.s3.amazonaws.com", path="/test.txt",
        headers={"Range": "bytes=0-9", "x-amz-content-sha256": fetch_module.EMPTY_SHA256,
                 "x-amz-date": "20130524T000000Z"},
        payload_sha256=fetch_module.EMPTY_SHA256, access_key="AKIAIOSFODNN7EXAMPLE", secret_key=SECRET_KEY,
        region="us-east-1", amz_date="20130524T000000Z")
    assert header == (
        "AWS4-HMAC-SHA256 Credential=AKIAIOSFODNN7EXAMPLE/20130524/us-east-1/s3/aws4_request, "
        "SignedHeaders=host;range;x-amz-content-sha256;x-amz-date, "
        "Signature=f0e8bdb87c964420e857bd35b5d6ed310bd44f0170aba48dd91039c6036bdb41")


class _Origin(http.server.BaseHTTPRequestHandler):
    """Serves ``routes`` (path -> bytes, or a callable taking the handler); records every request."""

    routes: dict[str, Any] = {}
    seen: list[dict[str, str]] = []

    def log_message(self, *args: object) -> None:
        pass

    def do_GET(self) -> None:  # noqa: N802
        type(self).seen.append({"path": self.path, **{k.lower(): v for k, v in self.headers.items()}})
        route = self.routes.get(self.path.split("?")[0])
        if callable(route):
            route(self)
            return
        if route is None:
            self.send_response(404)
            self.end_headers()
            return
        self.send_response(200)
        self.send_header("Content-Length", str(len(route)))
        self.end_headers()
        self.wfile.write(route)


@pytest.fixture
def origin() -> Iterator[tuple[str, type[_Origin]]]:
    handler = type("Origin", (_Origin,), {"routes": {}, "seen": []})
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}", handler
    finally:
        server.shutdown()
        server.server_close()


def _tar(files: dict[str, bytes], *, prefix: str = "", extra: Callable[[tarfile.TarFile], None] | None = None) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(prefix + name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        if extra:
            extra(tar)
    return buffer.getvalue()


FILES = {"models/classifier.onnx": b"\x08\x08onnx bytes" * 100, "models.yaml": MANIFEST.encode()}


def _fetch(dest: Path, url: str, *, sha256: str = "", timeout_s: float = 20, max_bytes: str = "1Mi",
           **extra: str) -> subprocess.CompletedProcess[str]:
    env = {"PATH": os.environ["PATH"], "TRITONBUNDLE_FETCH_URL": url, "TRITONBUNDLE_FETCH_DEST": str(dest),
           "TRITONBUNDLE_FETCH_MANIFEST": "models.yaml", "TRITONBUNDLE_FETCH_SHA256": sha256,
           "TRITONBUNDLE_FETCH_TIMEOUT_S": str(timeout_s), "TRITONBUNDLE_FETCH_MAX_BYTES": max_bytes,
           "NO_PROXY": "127.0.0.1", **extra}
    return subprocess.run([sys.executable, str(FETCH)], env=env, capture_output=True, text=True, timeout=120)


def _tree(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*"))
            if p.is_file() and p.name != ".tritonbundle-fetch.json"}


def test_fetch_unpacks_a_checked_archive_and_skips_the_download_when_the_volume_holds_it(
    origin: tuple[str, type[_Origin]], tmp_path: Path,
) -> None:
    address, handler = origin
    archive = _tar(FILES)
    handler.routes["/m/classifier.tar.gz"] = archive
    digest = hashlib.sha256(archive).hexdigest()
    dest = tmp_path / "volume" / "user-models"
    first = _fetch(dest, f"http://{address}/m/classifier.tar.gz", sha256=digest.upper())
    assert first.returncode == 0, first.stderr
    assert _tree(dest) == FILES and "(as expected)" in first.stdout
    assert sorted(p.name for p in dest.parent.iterdir()) == [".user-models.lock", "user-models"], "no leftovers"
    again = _fetch(dest, f"http://{address}/m/classifier.tar.gz", sha256=digest)
    assert again.returncode == 0 and "nothing to download" in again.stdout, again.stdout + again.stderr
    assert len(handler.seen) == 1, "the second start made no request"
    # No checksum: downloaded at every start, the folder kept when the archive did not change.
    unchecked = _fetch(dest, f"http://{address}/m/classifier.tar.gz")
    assert unchecked.returncode == 0 and "unchanged" in unchecked.stdout and "not checked" in unchecked.stdout


def test_fetch_refuses_an_archive_with_another_checksum_and_leaves_the_folder_as_it_was(
    origin: tuple[str, type[_Origin]], tmp_path: Path,
) -> None:
    address, handler = origin
    handler.routes["/old.tgz"] = old = _tar(FILES)
    handler.routes["/new.tgz"] = _tar({**FILES, "models/classifier.onnx": b"tampered"})
    dest = tmp_path / "user-models"
    assert _fetch(dest, f"http://{address}/old.tgz", sha256=hashlib.sha256(old).hexdigest()).returncode == 0
    # An upgrade to v2 whose download is not what was published (tampered, or a wrong link).
    v2 = hashlib.sha256(_tar({**FILES, "models/classifier.onnx": b"v2"})).hexdigest()
    refused = _fetch(dest, f"http://{address}/new.tgz", sha256=v2)
    assert refused.returncode == 1 and "is not the expected" in refused.stderr and "nothing was changed" in refused.stderr
    assert _tree(dest) == FILES
    assert sorted(p.name for p in tmp_path.iterdir()) == [".user-models.lock", "user-models"]


def test_fetch_takes_a_zip_and_an_archive_of_the_build_folder_itself(origin: tuple[str, type[_Origin]], tmp_path: Path) -> None:
    address, handler = origin
    buffer = io.BytesIO()
    with zipfile.ZipFile(buffer, "w") as z:
        for name, data in FILES.items():
            z.writestr(name, data)
    handler.routes["/m.zip"] = buffer.getvalue()
    handler.routes["/build.tgz"] = _tar(FILES, prefix="build/")  # tar -czf build.tgz build/
    for path, dest in (("/m.zip", tmp_path / "a"), ("/build.tgz", tmp_path / "b")):
        result = _fetch(dest, f"http://{address}{path}")
        assert result.returncode == 0, result.stderr
        assert _tree(dest) == FILES, path


def _info(name: str, size: int) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.size = size
    return info


def _symlink(tar: tarfile.TarFile) -> None:
    info = tarfile.TarInfo("models/link")
    info.type, info.linkname = tarfile.SYMTYPE, "/etc/passwd"
    tar.addfile(info)


@pytest.mark.parametrize(("archive", "message"), [
    (_tar(FILES, extra=lambda t: t.addfile(_info("../escape", 3), io.BytesIO(b"bad"))), "outside its folder"),
    (_tar(FILES, extra=lambda t: t.addfile(_info("/etc/cron.d/x", 3), io.BytesIO(b"bad"))), "outside its folder"),
    (_tar(FILES, extra=_symlink), "has a link"),
    (_tar({"models/classifier.onnx": b"x"}), "no models.yaml at its top"),
    (b"<html>not an archive</html>", "not an archive"),
    (_tar({**FILES, "models/big.bin": b"\0" * (2 << 20)}), "unpacks to more than"),
])
def test_fetch_refuses_unsafe_or_wrong_archives(origin: tuple[str, type[_Origin]], tmp_path: Path, archive: bytes,
                                                message: str) -> None:
    address, handler = origin
    handler.routes["/m.tgz"] = archive
    result = _fetch(tmp_path / "user-models", f"http://{address}/m.tgz", max_bytes="1Mi")
    assert result.returncode == 1 and message in result.stderr, result.stdout + result.stderr
    assert not (tmp_path / "user-models").exists() and not (tmp_path / "escape").exists()
    assert [p.name for p in tmp_path.iterdir()] == [".user-models.lock"], "no leftovers"


def test_fetch_is_bounded_in_size_and_time(origin: tuple[str, type[_Origin]], tmp_path: Path) -> None:
    address, handler = origin
    handler.routes["/big.tgz"] = b"\0" * (3 << 20)

    def stall(request: http.server.BaseHTTPRequestHandler) -> None:
        request.send_response(200)
        request.send_header("Content-Length", str(1 << 20))
        request.end_headers()
        for _ in range(40):  # a byte a second: each read answers, the whole never arrives in time
            request.wfile.write(b"x")
            request.wfile.flush()
            time.sleep(1)

    handler.routes["/slow.tgz"] = stall
    big = _fetch(tmp_path / "a", f"http://{address}/big.tgz", max_bytes="1Mi")
    assert big.returncode == 1 and "over the limit" in big.stderr, big.stderr
    started = time.monotonic()
    slow = _fetch(tmp_path / "b", f"http://{address}/slow.tgz", timeout_s=3)
    assert slow.returncode == 1 and "did not finish in time" in slow.stderr, slow.stderr
    assert time.monotonic() - started < 15


def test_fetch_retries_server_errors_and_stops_at_once_on_a_missing_object(
    origin: tuple[str, type[_Origin]], tmp_path: Path,
) -> None:
    address, handler = origin
    archive = _tar(FILES)
    answers = iter([503])

    def flaky(request: http.server.BaseHTTPRequestHandler) -> None:
        status = next(answers, 200)
        request.send_response(status)
        body = archive if status == 200 else b"busy"
        request.send_header("Content-Length", str(len(body)))
        request.end_headers()
        request.wfile.write(body)

    handler.routes["/flaky.tgz"] = flaky
    result = _fetch(tmp_path / "a", f"http://{address}/flaky.tgz")
    assert result.returncode == 0 and "attempt 1 failed (HTTP 503)" in result.stdout, result.stdout + result.stderr
    missing = _fetch(tmp_path / "b", f"http://{address}/nothing.tgz")
    assert missing.returncode == 1 and "HTTP 404 (check the URL)" in missing.stderr
    assert [s["path"] for s in handler.seen].count("/nothing.tgz") == 1


def test_fetch_sends_the_authorization_from_the_secret_and_prints_no_secret(
    origin: tuple[str, type[_Origin]], tmp_path: Path,
) -> None:
    address, handler = origin
    handler.routes["/private/m.tgz"] = _tar(FILES)
    token = "Bearer s3cr3t-token-value"
    url = f"http://user:p4ssw0rd@{address}/private/m.tgz?X-Amz-Signature=deadbeefsig&X-Amz-Credential=AKIDSECRET"
    result = _fetch(tmp_path / "user-models", url, TRITONBUNDLE_FETCH_AUTHORIZATION=token)
    assert result.returncode == 0, result.stderr
    assert handler.seen[-1]["authorization"] == token
    output = result.stdout + result.stderr
    for secret in ("s3cr3t", "p4ssw0rd", "deadbeefsig", "AKIDSECRET", "user:"):
        assert secret not in output, f"{secret} leaked into the log:\n{output}"
    assert f"http://{address}/private/m.tgz (query string not shown)" in output
    marker = (tmp_path / "user-models" / ".tritonbundle-fetch.json").read_text()
    assert "deadbeefsig" not in marker and "p4ssw0rd" not in marker


def test_fetch_signs_s3_requests_and_reports_s3_errors_without_echoing_them(
    fetch_module: ModuleType, origin: tuple[str, type[_Origin]], tmp_path: Path,
) -> None:
    """An S3-compatible stand-in (path-style, like MinIO): the request carries a Signature Version 4 header
    over exactly the host, path and x-amz-* headers it was sent with; S3's error body (which quotes the access
    key id and the string it signed) is reduced to its code and message."""
    address, handler = origin
    archive = _tar(FILES)
    signed: list[bool] = []

    def s3(request: http.server.BaseHTTPRequestHandler) -> None:
        headers = {k.lower(): v for k, v in request.headers.items()}
        names = headers["authorization"].split("SignedHeaders=")[1].split(",")[0].split(";")
        expected = fetch_module.sigv4_authorization(
            method="GET", host=headers["host"], path=request.path,
            headers={n: headers[n] for n in names if n != "host"}, payload_sha256=headers["x-amz-content-sha256"],
            access_key="AKIDEXAMPLE", secret_key=SECRET_KEY, region="eu-west-1", amz_date=headers["x-amz-date"])
        signed.append(expected == headers["authorization"])
        request.send_response(200)
        request.send_header("Content-Length", str(len(archive)))
        request.end_headers()
        request.wfile.write(archive)

    handler.routes["/ml-models/team%20a/m.tgz"] = s3
    creds = {"AWS_ACCESS_KEY_ID": "AKIDEXAMPLE", "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_SESSION_TOKEN": "tok3n",
             "TRITONBUNDLE_FETCH_S3_ENDPOINT": f"http://{address}", "TRITONBUNDLE_FETCH_S3_REGION": "eu-west-1"}
    result = _fetch(tmp_path / "user-models", "s3://ml-models/team a/m.tgz", sha256=hashlib.sha256(archive).hexdigest(),
                    **creds)
    assert result.returncode == 0, result.stdout + result.stderr
    assert signed == [True] and _tree(tmp_path / "user-models") == FILES
    sent = handler.seen[-1]
    assert sent["x-amz-security-token"] == "tok3n" and "x-amz-security-token" in sent["authorization"]
    assert "Credential=AKIDEXAMPLE/" in sent["authorization"] and SECRET_KEY not in result.stdout + result.stderr

    def denied(request: http.server.BaseHTTPRequestHandler) -> None:
        body = (b"<Error><Code>SignatureDoesNotMatch</Code><Message>The request signature we calculated does not "
                b"match</Message><AWSAccessKeyId>AKIDEXAMPLE</AWSAccessKeyId><StringToSign>AWS4-HMAC-SHA256 x"
                b"</StringToSign></Error>")
        request.send_response(403)
        request.send_header("Content-Length", str(len(body)))
        request.end_headers()
        request.wfile.write(body)

    handler.routes["/ml-models/denied.tgz"] = denied
    refused = _fetch(tmp_path / "other", "s3://ml-models/denied.tgz", **creds)
    assert refused.returncode == 1, refused.stderr
    assert "HTTP 403 SignatureDoesNotMatch: The request signature we calculated does not match" in refused.stderr
    assert "AKIDEXAMPLE" not in refused.stderr and "StringToSign" not in refused.stderr


@pytest.mark.parametrize(("extra", "message"), [
    ({"TRITONBUNDLE_FETCH_URL": ""}, "no URL"),
    ({"TRITONBUNDLE_FETCH_URL": "file:///etc/passwd"}, "only http://, https:// and s3://"),
    ({"TRITONBUNDLE_FETCH_URL": "s3://bucket-only"}, "names a bucket and an object key"),
    ({"TRITONBUNDLE_FETCH_MAX_BYTES": "lots"}, "not a size"),
])
def test_fetch_says_which_setting_is_wrong(tmp_path: Path, extra: dict[str, str], message: str) -> None:
    url = extra.pop("TRITONBUNDLE_FETCH_URL", "http://127.0.0.1:9/m.tgz")
    result = _fetch(tmp_path / "user-models", url, **extra)
    assert result.returncode == 2 and message in result.stderr, result.stderr


# -- engine-build.sh with a manifest on the volume ------------------------------------------------------
def _engine_build(tmp_path: Path, manifest: Path, *, source: str, wait_s: int) -> subprocess.Popen[str]:
    env = {**engine_build_env(tmp_path), "TRITONBUNDLE_MANIFEST": str(manifest), "TRITONBUNDLE_USER_MODELS": source,
           "TRITONBUNDLE_MANIFEST_WAIT_S": str(wait_s), "TRITONBUNDLE_SETTLE_S": "0"}
    return subprocess.Popen(["/bin/sh", str(ENGINE_BUILD)], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True)


def test_engine_build_waits_for_the_manifest_copied_onto_the_volume_then_builds_from_it(tmp_path: Path) -> None:
    manifest = tmp_path / "volume" / "user-models" / "models.yaml"
    process = _engine_build(tmp_path, manifest, source="pvc", wait_s=30)
    try:
        deadline = time.monotonic() + 20
        while not manifest.parent.is_dir() and time.monotonic() < deadline:  # the script makes the folder
            time.sleep(0.2)
        manifest.write_text(MANIFEST)
        output, _ = process.communicate(timeout=60)
    finally:
        process.kill()
    assert process.returncode == 0, output
    assert "waiting up to 30s" in output and "| kubectl exec -i <pod> -c engine-build -- tar -xf - -C" in output
    calls = (tmp_path / "calls.log").read_text().splitlines()
    assert calls[0] == "fingerprint" and f"--manifest {manifest} " in calls[2], calls


def test_engine_build_fails_with_the_copy_command_when_the_manifest_never_comes(tmp_path: Path) -> None:
    manifest = tmp_path / "volume" / "user-models" / "models.yaml"
    started = time.monotonic()
    process = _engine_build(tmp_path, manifest, source="pvc", wait_s=2)
    output, _ = process.communicate(timeout=60)
    assert process.returncode == 1 and f"error: no manifest at {manifest}" in output, output
    assert f"tar -C build -cf - models models.yaml | kubectl exec -i <pod> -c engine-build -- tar -xf - -C {manifest.parent}" in output
    assert time.monotonic() - started < 30 and not (tmp_path / "calls.log").read_text(), "nothing built"
    # Fetched from a URL: no wait, and no copy hint (fetch-models should have put it there).
    url = _engine_build(tmp_path, tmp_path / "nothing" / "models.yaml", source="url", wait_s=0)
    out, _ = url.communicate(timeout=60)
    assert url.returncode == 1 and "no manifest at" in out and "kubectl" not in out, out
