#!/bin/sh
# Init container: make sure the model repository on the volume is what this build image's tritonbundle writes
# (every config and file, TensorRT plans built for THIS node's GPU model and TensorRT version), then point the
# server at it.
#
#   <volume>/engines/<fingerprint>/model_repository   what Triton serves
#   <volume>/engines/<fingerprint>/artifacts          ONNX exports, plans, timing cache, build logs
#   $TRITONBUNDLE_RUN_DIR/model_repository            link to the first (Triton's --model-repository)
#
# The fingerprint (`tritonbundle fingerprint`: GPU model, compute capability, TensorRT version) keys the
# directory because plans are not portable across GPU models. `tritonbundle build --check` compares the WHOLE
# repository with what this build would write: every config.pbtxt and file byte for byte, and each plan's
# metadata against this GPU and TensorRT. It exits 0 when nothing differs, 1 when anything does (missing or
# stale plans, but also an upgrade that changes a queue policy, instance count, warm-up, parameter, the
# tokenizer's model.py or tokenizer.json); only then does this script build (rebuild or rewrite). Pods of the
# same GPU model sharing a ReadWriteMany volume take a lock, so one builds and the others reuse its work.
# Arguments are passed on to `tritonbundle build` (engineBuild.extraArgs, --force). --force rebuilds the
# engines from the ONNX exports on the volume; it never exports again (this image has no torch; re-exporting
# is `tritonbundle build --reexport`, run where torch is).
set -eu

log() { echo "engine-build: $*"; }

# Your own models (engineBuild.userModels, TRITONBUNDLE_USER_MODELS set): the manifest is on the volume, put
# there by you (pvc: wait up to TRITONBUNDLE_MANIFEST_WAIT_S for it, time to copy it in, the manifest last) or
# by the fetch-models init container (url: it must be there already).
if [ -n "${TRITONBUNDLE_USER_MODELS:-}" ]; then
  wait_s="${TRITONBUNDLE_MANIFEST_WAIT_S:-0}"
  folder="$(dirname "$TRITONBUNDLE_MANIFEST")"
  how="tar -C build -cf - models $(basename "$TRITONBUNDLE_MANIFEST") | kubectl exec -i <pod> -c engine-build -- tar -xf - -C $folder"
  waited=0
  while [ ! -f "$TRITONBUNDLE_MANIFEST" ]; do
    if [ "$waited" -ge "$wait_s" ]; then
      log "error: no manifest at $TRITONBUNDLE_MANIFEST (engineBuild.userModels.source: $TRITONBUNDLE_USER_MODELS)"
      if [ "$TRITONBUNDLE_USER_MODELS" = pvc ]; then
        log "copy the manifest and the files it names there, the manifest last, e.g. from the repository root:"
        log "  $how"
      fi
      exit 1
    fi
    if [ "$waited" = 0 ]; then
      mkdir -p "$folder"
      log "waiting up to ${wait_s}s for $TRITONBUNDLE_MANIFEST (engineBuild.userModels.waitSeconds); copy the"
      log "manifest and the files it names there, the manifest last, e.g. from the repository root:"
      log "  $how"
    fi
    sleep 2
    waited=$((waited + 2))
  done
  if [ "$waited" -gt 0 ]; then
    log "$TRITONBUNDLE_MANIFEST appeared: giving the copy ${TRITONBUNDLE_SETTLE_S:-5}s to finish"
    sleep "${TRITONBUNDLE_SETTLE_S:-5}"
  fi
  log "building your models from $TRITONBUNDLE_MANIFEST"
fi

fingerprint="$(tritonbundle fingerprint)"
if [ -z "$fingerprint" ]; then
  log "error: 'tritonbundle fingerprint' printed nothing (is a GPU visible? nvidia.com/gpu limit set?)"
  exit 1
fi
dir="$TRITONBUNDLE_CACHE_DIR/$fingerprint"
repo="$dir/model_repository"
artifacts="$dir/artifacts"
mkdir -p "$artifacts"
log "GPU fingerprint $fingerprint; engine cache $dir"

options="--manifest $TRITONBUNDLE_MANIFEST --target gpu --runtime tensorrt --repository $repo --artifacts $artifacts"
if [ -n "${TRITONBUNDLE_PRECISION:-}" ]; then
  options="$options --precision $TRITONBUNDLE_PRECISION"
fi
for model in ${TRITONBUNDLE_MODELS:-}; do
  options="$options --model $model"
done

if command -v flock >/dev/null 2>&1; then
  exec 9>"$dir/.build.lock"
  log "waiting for the build lock (up to ${TRITONBUNDLE_LOCK_TIMEOUT_S}s)"
  if ! flock -w "$TRITONBUNDLE_LOCK_TIMEOUT_S" 9; then
    log "error: another pod held $dir/.build.lock for ${TRITONBUNDLE_LOCK_TIMEOUT_S}s (engineBuild.lockTimeoutSeconds)"
    exit 1
  fi
else
  log "warning: flock not found; concurrent pods of this GPU model may build the same plans twice"
fi

# The build image has no torch: it carries the ONNX exports (made and parity-checked where torch was) in
# $TRITONBUNDLE_SEED_ARTIFACTS. Copy each file that is missing or different, so a new image's exports
# replace old ones; `build --check` then sees the ONNX hash change and the plans are rebuilt.
seed="${TRITONBUNDLE_SEED_ARTIFACTS:-}"
if [ -n "$seed" ] && [ -d "$seed" ]; then
  for src in "$seed"/*/; do
    [ -d "$src" ] || continue
    name="$(basename "$src")"
    mkdir -p "$artifacts/$name"
    for file in "$src"*; do
      [ -f "$file" ] || continue
      target="$artifacts/$name/$(basename "$file")"
      if ! cmp -s "$file" "$target"; then
        log "seeding $target from the image"
        cp "$file" "$target.tmp" && mv -f "$target.tmp" "$target"
      fi
    done
  done
elif [ -n "$seed" ]; then
  log "no exports at $seed in this image: tritonbundle build exports them (needs torch)"
fi

build=0
if [ "${TRITONBUNDLE_FORCE:-false}" = true ]; then
  log "engineBuild.force is set: rebuilding the engines (from the ONNX exports on the volume)"
  build=1
else
  status=0
  # shellcheck disable=SC2086  # $options is a list of words without spaces (paths come from the chart)
  tritonbundle build --check $options || status=$?
  case "$status" in
    0) log "$repo is what this build writes (every config and file, plans for this GPU and TensorRT version): nothing to build" ;;
    1) log "$repo differs from what this build writes (above: missing or stale plans, changed configs or files): building"; build=1 ;;
    *) log "error: 'tritonbundle build --check' failed with exit status $status"; exit "$status" ;;
  esac
fi

if [ "$build" = 1 ]; then
  started="$(date +%s)"
  # shellcheck disable=SC2086
  tritonbundle build $options "$@"
  # shellcheck disable=SC2086
  if ! tritonbundle build --check $options; then
    log "error: the repository just built does not pass 'tritonbundle build --check'"
    exit 1
  fi
  log "built in $(( $(date +%s) - started ))s"
fi

ln -sfn "$repo" "$TRITONBUNDLE_RUN_DIR/model_repository"
log "serving $repo"
