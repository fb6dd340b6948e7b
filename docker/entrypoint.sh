#!/bin/sh
# Entry point of the tritonbundle images (CPU, server, build, export).
#
# Triton's model-repository, shared-memory, trace and logging APIs change or reveal the server's state,
# so they always need a key (header `tritonbundle-key`). The key comes from $TRITONBUNDLE_API_KEY, or
# from the file named by $TRITONBUNDLE_API_KEY_FILE (a compose/Kubernetes secret). With neither, a random
# key is made up and never shown: those APIs are then simply locked, inference and health stay open.
#
#   tritonbundle-entrypoint tritonserver ARGS...   exec tritonserver with the restricted-API flags added
#   tritonbundle-entrypoint tritonbundle serve ... `tritonbundle serve` reads $TRITONBUNDLE_API_KEY itself
#   tritonbundle-entrypoint COMMAND ...            anything else runs as given
# In the NGC images, NVIDIA's /opt/nvidia/nvidia_entrypoint.sh then starts the command.
set -eu

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
  exec $nvidia "$binary" "$@"
fi

[ -z "${TRITONBUNDLE_API_KEY:-}" ] || export TRITONBUNDLE_API_KEY
exec $nvidia "$@"
