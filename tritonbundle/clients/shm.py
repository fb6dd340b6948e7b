"""System shared memory for large requests (client and server on the same host).

The input tensors are copied into one POSIX shared-memory region, which is registered with the
server, used by the request, then unregistered and destroyed, on success and on error alike. The
registration API is one of the restricted ones: the client's ``api_key`` unlocks it.

The gRPC frontend can still hold the finished request's reference to the region when the client
already has the answer, and Triton then refuses to drop it (src/shared_memory_manager.cc,
``UnregisterHelper``, ``use_count() > 1``). Triton 2.51-2.52 (the CPU server here, inside
nvidia-pytriton 0.7.0) answers such an unregister with INTERNAL "Cannot unregister shared memory
region '...', it is currently in use." (server commit edd0ac1b0); 2.53 and later (the NGC images)
answer success and only mark the region ``awaiting_unregister_`` (a861e56fb), and nothing drops it
later (two clean-clone CI runs left a region registered for good). Either way the client asks for the
region's status after unregistering and unregisters again, briefly backing off, until the server no
longer lists it: otherwise every such call would leave the server one more mapped region.
"""

from __future__ import annotations

import contextlib
import os
import time
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

from tritonbundle.log import LOG

PREFIX = "tritonbundle"


def _payload(array: np.ndarray[Any, Any]) -> tuple[np.ndarray[Any, Any], int]:
    """The array to copy into the region and its size in bytes (BYTES tensors are serialized
    into a 0-d object array holding the wire bytes, which tritonclient copies as is)."""
    if array.dtype == object:
        from tritonclient.utils import serialize_byte_tensor

        serialized = serialize_byte_tensor(array)
        return serialized, len(serialized.item())
    contiguous = np.ascontiguousarray(array)
    return contiguous, contiguous.nbytes


class SharedMemoryInputs:
    """One region holding every input of a request."""

    @staticmethod
    @contextlib.contextmanager
    def maybe(client: Any, inputs: Sequence[Any], arrays: Mapping[str, np.ndarray[Any, Any]]) -> Iterator[str | None]:
        """Use shared memory when the client asks for it and the request is big enough; yield the
        region's name (or None, and the caller sends the tensors in the request body)."""
        payloads = [_payload(a) for a in arrays.values()]
        total = sum(size for _, size in payloads)
        if not client.shared_memory or total < client.shared_memory_min_bytes:
            yield None
            return
        import tritonclient.utils.shared_memory as shm

        name = f"{PREFIX}_{os.getpid()}_{uuid.uuid4().hex[:12]}"
        handle = shm.create_shared_memory_region(name, "/" + name, total)
        registered = False
        headers = client._restricted_headers()
        try:
            offset = 0
            for inp, (payload, size) in zip(inputs, payloads):
                shm.set_shared_memory_region(handle, [payload], offset=offset)
                inp.set_shared_memory(name, size, offset=offset)
                offset += size
            client._client.register_system_shared_memory(name, "/" + name, total, headers=headers)
            registered = True
            yield name
        finally:
            if registered:
                try:
                    unregister(client._client, name, headers)
                except Exception as e:  # noqa: BLE001 - the request's own outcome matters more
                    LOG.warning("could not unregister shared-memory region %s: %s", name, e)
            shm.destroy_shared_memory_region(handle)


#: What Triton 2.51-2.52 answers to an unregister of a region a request still holds.
IN_USE = "it is currently in use"

#: Pauses before each unregister of a region the server still lists (about 1 s in all).
UNREGISTER_BACKOFF_S = (0.0, 0.01, 0.02, 0.05, 0.1, 0.2, 0.3, 0.3)


def unregister(triton: Any, name: str, headers: Mapping[str, str]) -> None:
    """Unregister ``name`` until the server no longer lists it (see the module's note on Triton)."""
    from tritonclient.utils import InferenceServerException

    for pause in UNREGISTER_BACKOFF_S:
        time.sleep(pause)
        try:
            triton.unregister_system_shared_memory(name, headers=headers)
        except InferenceServerException as e:
            if IN_USE not in str(e):
                raise
        if not _listed(triton, name, headers):
            return
    LOG.warning("the server still lists shared-memory region %s after %d unregisters", name,
                len(UNREGISTER_BACKOFF_S))


def _listed(triton: Any, name: str, headers: Mapping[str, str]) -> bool:
    """Whether the server lists region ``name`` (HTTP: a list of dicts; gRPC: a response with ``regions``)."""
    from tritonclient.utils import InferenceServerException

    try:
        status = triton.get_system_shared_memory_status(region_name=name, headers=headers)
    except InferenceServerException:  # NOT_FOUND: gone
        return False
    if hasattr(status, "regions"):
        return name in status.regions
    return any(region.get("name") == name for region in status or [])


def leftover_regions() -> list[str]:
    """Shared-memory regions of this process still present in /dev/shm (tests assert none)."""
    prefix = f"{PREFIX}_{os.getpid()}_"
    try:
        return sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix))
    except FileNotFoundError:
        return []
