#!/usr/bin/env bash
# Run HERE (the CPU machine): build the git-ignored folders a GPU machine without network needs for
# `tritonbundle bench gpu` (see docs/benchmarks.md):
#   .device/server  trimmed tritonserver (Python backend, py3.12 stub) + cp312 wheels + tokenizer.json  (~21 MB)
#   .device/grpc    grpcio wheel, only if the GPU machine's grpcio is too old for tritonclient          (~7 MB)
#   .device/http    geventhttpclient, gevent: what tritonclient.http imports (HTTP sender, clients) (~5 MB)
#   .device/model   all-MiniLM-L6-v2 FP16 weights as xz byte planes + config.json + tokenizer.json       (~39 MB)
# usage: scripts/device_pack.sh [--parts server,stubs,grpc,http,model,peer]        (about 2-3 minutes; needs pip access)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-.venv/bin/python}
"$PY" scripts/device_pack.py pack --out .device "$@"
du -sh .device/server .device/grpc .device/http .device/model 2>/dev/null || true
# A device call takes 64 MiB: the working tree that travels (tracked + untracked, not ignored) plus
# what it carries. The committed reports are most of the tree and no run reads them there.
tree=$({ git ls-files; git ls-files --others --exclude-standard; } | xargs -d '\n' du -cb 2>/dev/null | tail -1 | cut -f1)
reports=$(find docs/benchmarks -mindepth 2 -type f -print0 | du -cb --files0-from=- | tail -1 | cut -f1)
echo "working tree that travels: $((tree / 1048576)) MiB, of which $((reports / 1048576)) MiB are reports in"
echo "docs/benchmarks/*/; left to carry: $(((67108864 - tree) / 1048576)) MiB of 64 (docs/benchmarks.md, 'On the lent GPU machine')"
