"""Init container `fetch-models`: bring a user's models onto the model-cache volume before the engine build.

Downloads an archive (.tar, .tar.gz/.tgz, .tar.bz2, .tar.xz or .zip, told apart by content) holding a models
manifest and the files it names, laid out like the repository's build/ folder (models.yaml next to models/,
traffic/, calibration/), checks its sha256, and unpacks it into TRITONBUNDLE_FETCH_DEST, which the
engine-build init container then reads the manifest from. Standard library only (it runs in the build image,
from the chart's scripts ConfigMap).

    TRITONBUNDLE_FETCH_URL          http://, https:// or s3://bucket/key (values, or a Secret for a presigned URL)
    TRITONBUNDLE_FETCH_DEST         the folder to fill; replaced as a whole (rename), never half-written
    TRITONBUNDLE_FETCH_MANIFEST     the manifest's path inside the archive (refused when missing)
    TRITONBUNDLE_FETCH_SHA256       the archive's sha256: a download that differs is refused, and a folder
                                    already unpacked from this archive is kept without downloading. Empty:
                                    downloaded at every start (the folder is replaced only when it changed)
    TRITONBUNDLE_FETCH_TIMEOUT_S    deadline of the whole fetch (connecting, retries, reading, waiting for
                                    another pod's fetch of the same folder)
    TRITONBUNDLE_FETCH_MAX_BYTES    largest archive, and largest unpacked total, in bytes (20Gi, 500M also do)
    TRITONBUNDLE_FETCH_AUTHORIZATION  http(s): the Authorization header's value (from a Secret)
    AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, AWS_SESSION_TOKEN  s3://: credentials (from a Secret); the
                                    request is signed with AWS Signature Version 4; none: an anonymous GET
    TRITONBUNDLE_FETCH_S3_ENDPOINT  s3://: a non-AWS store as http(s)://host:port (path-style requests);
                                    empty: AWS, https://<bucket>.s3.<region>.amazonaws.com
    TRITONBUNDLE_FETCH_S3_REGION    s3://: the region requests are signed for (us-east-1)

Nothing secret is printed: the URL only as scheme://host/path (no user info, no query string, which carries a
presigned URL's signature), credentials never, an error answer only by its status and S3 error code.
Exit status: 0 fetched or already there, 1 the fetch failed or was refused, 2 a setting is wrong.
"""

from __future__ import annotations

import base64
import datetime
import errno
import fcntl
import hashlib
import hmac
import http.client
import json
import os
import re
import shutil
import stat
import sys
import tarfile
import time
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from pathlib import Path, PurePosixPath

CHUNK = 1 << 20
#: Attempts for answers that may pass (connection errors, timeouts of one read, HTTP 429 and 5xx).
ATTEMPTS = 3
#: Longest wait for one socket operation; the overall deadline still bounds the whole fetch.
SOCKET_TIMEOUT_S = 30.0
MAX_MEMBERS = 100_000
MARKER = ".tritonbundle-fetch.json"
EMPTY_SHA256 = hashlib.sha256(b"").hexdigest()
_UNITS = {"": 1, "k": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
          "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40}


class FetchError(Exception):
    """A fetch that failed or was refused; the message is safe to print."""


class SettingError(Exception):
    """A setting the chart passed is wrong."""


def log(message: str) -> None:
    print(f"fetch-models: {message}", flush=True)


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*([0-9]+)\s*(|k|M|G|T|Ki|Mi|Gi|Ti)\s*", text)
    if not m or int(m.group(1)) < 1:
        raise SettingError(f"TRITONBUNDLE_FETCH_MAX_BYTES={text!r}: not a size (bytes, or a quantity such as 20Gi)")
    return int(m.group(1)) * _UNITS[m.group(2)]


def human(size: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024:
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} TiB"


def redact(url: str) -> str:
    """scheme://host[:port]/path: no user info, query string or fragment (a presigned URL's signature)."""
    parts = urllib.parse.urlsplit(url)
    host = parts.hostname or ""
    if parts.port:
        host = f"{host}:{parts.port}"
    hidden = " (query string not shown)" if parts.query else ""
    return f"{parts.scheme}://{host}{parts.path}{hidden}"


# -- S3: AWS Signature Version 4 ------------------------------------------------------------------
def _hmac(key: bytes, text: str) -> bytes:
    return hmac.new(key, text.encode(), hashlib.sha256).digest()


def sigv4_authorization(
    *, method: str, host: str, path: str, headers: dict[str, str], payload_sha256: str, access_key: str,
    secret_key: str, region: str, amz_date: str, service: str = "s3", query: str = "",
) -> str:
    """The Authorization header of a request signed with AWS Signature Version 4. ``path`` is the canonical
    (already URI-encoded) path; ``headers`` are the headers to sign besides host (x-amz-date among them)."""
    signed = {"host": host.strip(), **{k.lower(): " ".join(v.split()) for k, v in headers.items()}}
    names = sorted(signed)
    canonical = "\n".join([
        method, path, query, *(f"{n}:{signed[n]}" for n in names), "", ";".join(names), payload_sha256,
    ])
    day = amz_date[:8]
    scope = f"{day}/{region}/{service}/aws4_request"
    to_sign = "\n".join(["AWS4-HMAC-SHA256", amz_date, scope, hashlib.sha256(canonical.encode()).hexdigest()])
    key = _hmac(_hmac(_hmac(_hmac(f"AWS4{secret_key}".encode(), day), region), service), "aws4_request")
    signature = hmac.new(key, to_sign.encode(), hashlib.sha256).hexdigest()
    return f"AWS4-HMAC-SHA256 Credential={access_key}/{scope}, SignedHeaders={';'.join(names)}, Signature={signature}"


def s3_request(url: str, *, endpoint: str, region: str, env: dict[str, str], now: datetime.datetime) -> tuple[str, dict[str, str]]:
    """The https (or endpoint's) URL of s3://bucket/key, and its headers (signed when credentials are set)."""
    parts = urllib.parse.urlsplit(url)
    bucket, key = parts.netloc, parts.path.lstrip("/")
    if not bucket or not key:
        raise SettingError(f"{redact(url)}: an s3:// URL names a bucket and an object key (s3://bucket/path/models.tar.gz)")
    quoted = urllib.parse.quote(key, safe="/~")
    if endpoint:
        ep = urllib.parse.urlsplit(endpoint)
        if ep.scheme not in ("http", "https") or not ep.netloc:
            raise SettingError(f"TRITONBUNDLE_FETCH_S3_ENDPOINT={endpoint!r}: use http(s)://host:port")
        host, path = ep.netloc, f"{ep.path.rstrip('/')}/{bucket}/{quoted}"
        target = f"{ep.scheme}://{host}{path}"
    elif "." in bucket:  # virtual-hosted style would break TLS name checks
        host, path = f"s3.{region}.amazonaws.com", f"/{bucket}/{quoted}"
        target = f"https://{host}{path}"
    else:
        host, path = f"{bucket}.s3.{region}.amazonaws.com", f"/{quoted}"
        target = f"https://{host}{path}"
    access, secret = env.get("AWS_ACCESS_KEY_ID", ""), env.get("AWS_SECRET_ACCESS_KEY", "")
    if not (access and secret):
        log("no S3 credentials in the Secret: an anonymous GET")
        return target, {}
    amz_date = now.strftime("%Y%m%dT%H%M%SZ")
    headers = {"x-amz-content-sha256": EMPTY_SHA256, "x-amz-date": amz_date}
    if env.get("AWS_SESSION_TOKEN"):
        headers["x-amz-security-token"] = env["AWS_SESSION_TOKEN"]
    headers["Authorization"] = sigv4_authorization(
        method="GET", host=host, path=path, headers=headers, payload_sha256=EMPTY_SHA256, access_key=access,
        secret_key=secret, region=region, amz_date=amz_date)
    log("signing the S3 request with the access key from the Secret")
    return target, headers


def without_user_info(url: str) -> tuple[str, dict[str, str]]:
    """https://user:password@host/... (urllib would take user:password for a host name): the URL without
    them, and HTTP basic authentication with them."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None:
        return url, {}
    netloc = parts.netloc.rsplit("@", 1)[1]
    pair = f"{urllib.parse.unquote(parts.username)}:{urllib.parse.unquote(parts.password or '')}"
    log("using the user and password in the URL (HTTP basic authentication)")
    return urllib.parse.urlunsplit(parts._replace(netloc=netloc)), {
        "Authorization": "Basic " + base64.b64encode(pair.encode()).decode()}


# -- download ---------------------------------------------------------------------------------------
def _error_detail(error: urllib.error.HTTPError) -> str:
    """An HTTP error by its status and, for S3, its error code and message: never the whole body (S3's
    SignatureDoesNotMatch answer quotes the access key id and the string that was signed)."""
    try:
        body = error.read(4096).decode(errors="replace")
    except Exception:  # noqa: BLE001 - the status alone still says what happened
        body = ""
    detail = f"HTTP {error.code}"
    code = re.search(r"<Code>([^<]{1,100})</Code>", body)
    message = re.search(r"<Message>([^<]{1,300})</Message>", body)
    if code:
        detail += f" {code.group(1)}"
    if message:
        detail += f": {message.group(1)}"
    hint = {401: "check the credentials in the Secret", 403: "check the credentials in the Secret and their access",
            404: "check the URL"}.get(error.code)
    return f"{detail} ({hint})" if hint else detail


class _NoAuthOnRedirect(urllib.request.HTTPRedirectHandler):
    """Follow redirects within http(s) only; the Authorization header is an unredirected one, so it never
    follows a redirect to another host."""

    def redirect_request(self, req, fp, code, msg, headers, newurl):  # type: ignore[no-untyped-def]  # noqa: ANN001
        if urllib.parse.urlsplit(newurl).scheme not in ("http", "https"):
            raise FetchError(f"refusing a redirect to {redact(newurl)}")
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def download(url: str, headers: dict[str, str], target: Path, *, deadline: float, max_bytes: int,
             shown: str) -> str:
    """GET ``url`` into ``target``; returns the sha256. Retries what may pass, within the deadline."""
    opener = urllib.request.build_opener(_NoAuthOnRedirect())
    last = ""
    for attempt in range(1, ATTEMPTS + 1):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            break
        request = urllib.request.Request(url, method="GET")
        for name, value in headers.items():
            request.add_unredirected_header(name, value)
        try:
            with opener.open(request, timeout=min(SOCKET_TIMEOUT_S, remaining)) as response:
                return _read_body(response, target, deadline=deadline, max_bytes=max_bytes, shown=shown)
        except urllib.error.HTTPError as e:
            last = _error_detail(e)
            if e.code != 429 and e.code < 500:
                raise FetchError(f"{shown}: {last}") from None
        except (urllib.error.URLError, OSError, http.client.HTTPException) as e:
            reason = getattr(e, "reason", e)
            last = f"{type(reason).__name__}: {reason}" if not isinstance(reason, str) else reason
        if attempt < ATTEMPTS:
            pause = min(2.0 ** attempt, max(0.0, deadline - time.monotonic()))
            log(f"attempt {attempt} failed ({last}); again in {pause:.0f} s")
            time.sleep(pause)
    raise FetchError(f"{shown}: no archive within the time and attempts allowed (last: {last or 'timed out'})")


def _read_body(response, target: Path, *, deadline: float, max_bytes: int, shown: str) -> str:  # type: ignore[no-untyped-def]  # noqa: ANN001
    length = response.headers.get("Content-Length")
    if length and length.isdigit() and int(length) > max_bytes:
        raise FetchError(f"{shown} is {human(int(length))}, over the limit of {human(max_bytes)} "
                         "(engineBuild.userModels.url.maxSize)")
    digest = hashlib.sha256()
    size = 0
    reported = time.monotonic()
    read = getattr(response, "read1", response.read)
    with target.open("wb") as out:
        while True:
            if time.monotonic() > deadline:
                raise FetchError(f"{shown}: the download did not finish in time (engineBuild.userModels.url.timeoutSeconds)")
            chunk = read(CHUNK)  # what has arrived (one system call), so the deadline is checked often
            if not chunk:
                break
            size += len(chunk)
            if size > max_bytes:
                raise FetchError(f"{shown}: more than {human(max_bytes)} (engineBuild.userModels.url.maxSize)")
            digest.update(chunk)
            out.write(chunk)
            if time.monotonic() - reported > 10:
                reported = time.monotonic()
                log(f"downloaded {human(size)}" + (f" of {human(int(length))}" if length and length.isdigit() else ""))
    if length and length.isdigit() and size != int(length):
        raise FetchError(f"{shown}: the connection ended after {size} of {length} bytes")
    log(f"downloaded {human(size)}")
    return digest.hexdigest()


# -- unpacking --------------------------------------------------------------------------------------
def _member_path(root: Path, name: str) -> Path:
    """Where an archive member lands; refuses names that would land outside ``root``."""
    pure = PurePosixPath(name.replace("\\", "/"))
    if pure.is_absolute() or ".." in pure.parts or not pure.parts or re.match(r"^[A-Za-z]:", name):
        raise FetchError(f"the archive has an entry outside its folder: {name!r}")
    parts = [p for p in pure.parts if p != "."]
    return root.joinpath(*parts) if parts else root


def _copy(source, target: Path, *, budget: list[int], name: str, max_bytes: int) -> None:  # type: ignore[no-untyped-def]  # noqa: ANN001
    target.parent.mkdir(parents=True, exist_ok=True)
    with target.open("wb") as out:
        while True:
            chunk = source.read(CHUNK)
            if not chunk:
                break
            budget[0] += len(chunk)
            if budget[0] > max_bytes:
                raise FetchError(f"the archive unpacks to more than {human(max_bytes)} (at {name!r}; "
                                 "engineBuild.userModels.url.maxSize)")
            out.write(chunk)


def unpack(archive: Path, root: Path, *, max_bytes: int) -> int:
    """Unpack regular files and folders only (no links, devices or entries outside ``root``); returns the
    number of files."""
    root.mkdir(parents=True)
    budget = [0]
    files = 0
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as z:
            members = z.infolist()
            if len(members) > MAX_MEMBERS:
                raise FetchError(f"the archive has more than {MAX_MEMBERS} entries")
            for info in members:
                path = _member_path(root, info.filename)
                mode = info.external_attr >> 16
                if stat.S_ISLNK(mode):
                    raise FetchError(f"the archive has a link, refused: {info.filename!r}")
                if info.is_dir():
                    path.mkdir(parents=True, exist_ok=True)
                    continue
                with z.open(info) as source:
                    _copy(source, path, budget=budget, name=info.filename, max_bytes=max_bytes)
                files += 1
        return files
    try:
        tar = tarfile.open(archive, "r:*")
    except tarfile.TarError:
        raise FetchError("the download is not an archive (.tar, .tar.gz, .tgz, .tar.bz2, .tar.xz or .zip)") from None
    with tar:
        count = 0
        for member in tar:
            count += 1
            if count > MAX_MEMBERS:
                raise FetchError(f"the archive has more than {MAX_MEMBERS} entries")
            path = _member_path(root, member.name)
            if member.isdir():
                path.mkdir(parents=True, exist_ok=True)
            elif member.isfile():
                source = tar.extractfile(member)
                assert source is not None
                with source:
                    _copy(source, path, budget=budget, name=member.name, max_bytes=max_bytes)
                files += 1
            else:
                kind = "link" if member.issym() or member.islnk() else "special file"
                raise FetchError(f"the archive has a {kind}, refused: {member.name!r}")
    return files


def content_root(unpacked: Path, manifest: str) -> Path:
    """The folder holding the manifest: the archive's top, or its only folder (`tar -czf m.tgz build/`)."""
    if (unpacked / manifest).is_file():
        return unpacked
    entries = [p for p in unpacked.iterdir()]
    if len(entries) == 1 and entries[0].is_dir() and (entries[0] / manifest).is_file():
        return entries[0]
    listed = ", ".join(sorted(p.name + ("/" if p.is_dir() else "") for p in entries)[:10]) or "nothing"
    raise FetchError(f"the archive has no {manifest} at its top (engineBuild.userModels.manifest); it holds: {listed}")


# -- the folder on the volume -----------------------------------------------------------------------
def _lock(path: Path, deadline: float) -> int:
    """An exclusive lock shared with the other pods' fetches of the same folder (a ReadWriteMany volume)."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    waited = False
    while True:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return fd
        except OSError as e:
            if e.errno not in (errno.EAGAIN, errno.EACCES):
                raise
        if not waited:
            log(f"another pod is fetching into this folder: waiting for {path.name}")
            waited = True
        if time.monotonic() > deadline:
            raise FetchError("another pod's fetch of the same folder did not finish in time")
        time.sleep(1)


def read_marker(dest: Path) -> dict[str, str]:
    try:
        data = json.loads((dest / MARKER).read_text())
        return data if isinstance(data, dict) else {}
    except (OSError, ValueError):
        return {}


def install(root: Path, dest: Path, scratch: str) -> None:
    """Put ``root`` in place of ``dest`` by renames (same file system), so readers see old or new, whole."""
    old = dest.parent / f"{scratch}old"
    if dest.exists():
        dest.rename(old)
    root.rename(dest)
    shutil.rmtree(old, ignore_errors=True)


def fetch(env: dict[str, str]) -> None:
    url = env.get("TRITONBUNDLE_FETCH_URL", "").strip()
    dest = Path(env.get("TRITONBUNDLE_FETCH_DEST", ""))
    manifest = env.get("TRITONBUNDLE_FETCH_MANIFEST", "models.yaml")
    expected = env.get("TRITONBUNDLE_FETCH_SHA256", "").strip().lower()
    try:
        timeout_s = float(env.get("TRITONBUNDLE_FETCH_TIMEOUT_S", "900"))
    except ValueError:
        raise SettingError("TRITONBUNDLE_FETCH_TIMEOUT_S is not a number") from None
    max_bytes = parse_size(env.get("TRITONBUNDLE_FETCH_MAX_BYTES", "20Gi"))
    scheme = urllib.parse.urlsplit(url).scheme
    if not url:
        raise SettingError("no URL: set engineBuild.userModels.url.location, or the Secret's URL entry "
                           "(engineBuild.userModels.url.credentials.urlKey)")
    if scheme not in ("http", "https", "s3"):
        raise SettingError(f"{redact(url)}: only http://, https:// and s3:// URLs are fetched")
    if expected and not re.fullmatch(r"[0-9a-f]{64}", expected):
        raise SettingError("TRITONBUNDLE_FETCH_SHA256 is not 64 hexadecimal digits")
    if not dest.is_absolute() or dest.parent == dest:
        raise SettingError(f"TRITONBUNDLE_FETCH_DEST={str(dest)!r}: an absolute folder on the volume")
    shown = redact(url)
    deadline = time.monotonic() + timeout_s
    dest.parent.mkdir(parents=True, exist_ok=True)
    scratch = f".{dest.name}.fetch-"
    lock = _lock(dest.parent / f".{dest.name}.lock", deadline)
    try:
        for leftover in dest.parent.glob(scratch + "*"):  # from a fetch that was killed
            shutil.rmtree(leftover, ignore_errors=True) if leftover.is_dir() else leftover.unlink(missing_ok=True)
        marker = read_marker(dest)
        if expected and marker.get("sha256") == expected and (dest / marker.get("manifest", manifest)).is_file():
            log(f"{dest} already holds the archive with sha256 {expected}: nothing to download")
            return
        log(f"fetching {shown} into {dest} (at most {human(max_bytes)}, {timeout_s:g} s)")
        if scheme == "s3":
            target, headers = s3_request(url, endpoint=env.get("TRITONBUNDLE_FETCH_S3_ENDPOINT", ""),
                                         region=env.get("TRITONBUNDLE_FETCH_S3_REGION", "") or "us-east-1", env=env,
                                         now=datetime.datetime.now(datetime.timezone.utc))
        else:
            target, headers = without_user_info(url)
            if env.get("TRITONBUNDLE_FETCH_AUTHORIZATION"):
                headers["Authorization"] = env["TRITONBUNDLE_FETCH_AUTHORIZATION"]
                log("sending the Authorization header from the Secret")
        archive = dest.parent / f"{scratch}archive"
        digest = download(target, headers, archive, deadline=deadline, max_bytes=max_bytes, shown=shown)
        if expected and digest != expected:
            raise FetchError(f"{shown}: sha256 {digest} is not the expected {expected} "
                             "(engineBuild.userModels.url.sha256); nothing was changed")
        log(f"sha256 {digest}" + (" (as expected)" if expected else " (not checked: set engineBuild.userModels.url.sha256)"))
        if marker.get("sha256") == digest and (dest / marker.get("manifest", manifest)).is_file():
            log(f"{dest} already holds this archive: unchanged")
            return
        unpacked = dest.parent / f"{scratch}new"
        files = unpack(archive, unpacked, max_bytes=max_bytes)
        archive.unlink()
        root = content_root(unpacked, manifest)
        (root / MARKER).write_text(json.dumps({"sha256": digest, "url": shown, "manifest": manifest}))
        install(root, dest, scratch)
        shutil.rmtree(unpacked, ignore_errors=True)
        log(f"unpacked {files} files into {dest}; the manifest is {dest / manifest}")
    finally:
        for leftover in dest.parent.glob(scratch + "*"):
            shutil.rmtree(leftover, ignore_errors=True) if leftover.is_dir() else leftover.unlink(missing_ok=True)
        os.close(lock)


def main() -> int:
    try:
        fetch(dict(os.environ))
    except SettingError as e:
        print(f"fetch-models: error: {e}", file=sys.stderr)
        return 2
    except FetchError as e:
        print(f"fetch-models: error: {e}", file=sys.stderr)
        return 1
    except OSError as e:  # the volume: full, read-only, not writable by this user
        print(f"fetch-models: error: {type(e).__name__}: {e.strerror or e}"
              + (f": {e.filename}" if e.filename else ""), file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
