#!/bin/sh
# Entry point of the tritonbundle images (CPU, server, build, export).
#
# Triton's model-repository, shared-memory, trace and logging APIs change or reveal the server's state,
# so they always need a key (header `tritonbundle-key`). The key comes from $TRITONBUNDLE_API_KEY, or
# from the file named by $TRITONBUNDLE_API_KEY_FILE (a compose/Kubernetes secret). With neither, a random
# key is made up and never shown: those APIs are then simply locked, inference and health stay open.
#
#   tritonbundle-entrypoint tritonserver ARGS...   exec tritonserver with the restricted-API flags added,
#                                                  after the TensorRT plan check (below)
#   tritonbundle-entrypoint tritonbundle serve ... `tritonbundle serve` reads $TRITONBUNDLE_API_KEY itself
#   tritonbundle-entrypoint COMMAND ...            anything else runs as given
# In the NGC images, NVIDIA's /opt/nvidia/nvidia_entrypoint.sh then starts the command.
#
# TensorRT plans run only on the TensorRT that built them. Where the image carries the plan check
# ($TRITONBUNDLE_TENSORRT_PLANS, default /opt/tritonbundle/bin/tensorrt-plans.py: the server image's
# copy of tritonbundle/runtimes/tensorrt/serving.py, standard library only), tritonserver is started
# through it, right before the server starts: it compares every *.plan.json in --model-repository with
# this server's TensorRT and exits 2, naming both versions, on a mismatch; it adds
# --backend-config=tensorrt,version-compatible=true when the plans are version-compatible; then it
# execs tritonserver (same pid, so signals still reach the server).
set -eu

plans_check="${TRITONBUNDLE_TENSORRT_PLANS:-/opt/tritonbundle/bin/tensorrt-plans.py}"

# The NGC images' own entry point (banner, driver checks, CUDA forward-compatibility libraries) runs
# first where there is one; it ends with `exec "$@"`.
nvidia=""
if [ -x /opt/nvidia/nvidia_entrypoint.sh ] && [ "${TRITONBUNDLE_SKIP_NVIDIA_ENTRYPOINT:-0}" != 1 ]; then
  nvidia=/opt/nvidia/nvidia_entrypoint.sh
fi

if [ -z "${TRITONBUNDLE_API_KEY:-}" ] && [ -n "${TRITONBUNDLE_API_KEY_FILE:-}" ]; then
  [ -r "$TRITONBUNDLE_API_KEY_FILE" ] || { echo "entrypoint: cannot read TRITONBUNDLE_API_KEY_FILE=$TRITONBUNDLE_API_KEY_FILE" >&2; exit 1; }
  TRITONBUNDLE_API_KEY="$(tr -d '\r\n' <"$TRITONBUNDLE_API_KEY_FILE")"
fi

first="${1:-}"
serving=0
case "${first##*/}" in
  tritonserver) serving=1 ;;
  tritonbundle) [ "${2:-}" != serve ] || serving=1 ;;
esac
if [ "$serving" = 1 ] && [ -z "${TRITONBUNDLE_API_KEY:-}" ]; then
  TRITONBUNDLE_API_KEY="$(od -An -N24 -tx1 /dev/urandom | tr -d ' \n')"
  echo "entrypoint: TRITONBUNDLE_API_KEY is not set: the model-repository, shared-memory, trace and logging APIs are locked" >&2
fi

if [ "${first##*/}" = tritonserver ]; then
  # MPS pays off for models whose instances are separate processes (the pytorch runtime, which
  # `tritonbundle serve` runs); this image serves TensorRT and ONNX Runtime models: one process already.
  if [ "${TRITONBUNDLE_GPU_SHARING:-time-slicing}" != time-slicing ]; then
    echo "entrypoint: TRITONBUNDLE_GPU_SHARING=$TRITONBUNDLE_GPU_SHARING is ignored by tritonserver here: it is for" \
      "\`tritonbundle serve\`, \`bench\` and \`tune\` (README, \"Sharing the GPU\")" >&2
  fi
  binary="$first"
  shift
  if [ "$binary" = tritonserver ]; then
    binary="$(command -v tritonserver || echo /opt/tritonserver/bin/tritonserver)"
  fi
  for api in model-repository shared-memory trace logging; do
    set -- "$@" "--http-restricted-api=$api:tritonbundle-key=$TRITONBUNDLE_API_KEY" \
      "--grpc-restricted-protocol=$api:tritonbundle-key=$TRITONBUNDLE_API_KEY"
  done
  unset TRITONBUNDLE_API_KEY TRITONBUNDLE_API_KEY_FILE
  if [ -n "${TRITONBUNDLE_TENSORRT_PLANS:-}" ] && [ ! -f "$plans_check" ]; then
    echo "entrypoint: TRITONBUNDLE_TENSORRT_PLANS=$plans_check is not a file" >&2
    exit 1
  fi
  if [ -f "$plans_check" ]; then
    exec $nvidia python3 "$plans_check" exec "$binary" "$@"
  fi
  exec $nvidia "$binary" "$@"
fi

[ -z "${TRITONBUNDLE_API_KEY:-}" ] || export TRITONBUNDLE_API_KEY
exec $nvidia "$@"
