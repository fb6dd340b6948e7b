"""System shared memory for large requests (client and server on the same host).

The input tensors are copied into one POSIX shared-memory region, which is registered with the
server, used by the request, then unregistered and destroyed, on success and on error alike. The
registration API is one of the restricted ones: the client's ``api_key`` unlocks it.

Triton accepts the unregister even while the request still holds the region and drops the region
when the request is released (src/shared_memory_manager.cc, ``UnregisterHelper``), so the server's
status may list it for a moment after the answer; destroying our side of it is safe then, the server
keeps its own mapping until it lets go.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator, Mapping, Sequence
from typing import Any

import numpy as np

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
                with contextlib.suppress(Exception):
                    client._client.unregister_system_shared_memory(name, headers=headers)
            shm.destroy_shared_memory_region(handle)


def leftover_regions() -> list[str]:
    """Shared-memory regions of this process still present in /dev/shm (tests assert none)."""
    prefix = f"{PREFIX}_{os.getpid()}_"
    try:
        return sorted(n for n in os.listdir("/dev/shm") if n.startswith(prefix))
    except FileNotFoundError:
        return []
