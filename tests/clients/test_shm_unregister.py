"""The client unregisters a shared-memory region until the server no longer lists it. While a request
still holds the region, Triton 2.53+ answers an unregister with success and only marks it, and Triton
2.51-2.52 (the CPU server here) refuses it with "it is currently in use" (src/shared_memory_manager.cc,
``UnregisterHelper``). The double below keeps listing the region for as many unregisters as it is
told, answering either way, as Triton does while the finished request's reference lingers;
tests/clients/test_clients.py checks the real server lists nothing after real calls."""

from __future__ import annotations

from typing import Any

import pytest
from tritonclient.utils import InferenceServerException

from tritonbundle.clients import shm


class MarkingServer:
    """The region stays listed for the first ``held`` unregisters, which succeed (2.53+) or, with
    ``refuses``, fail as in use (2.51-2.52)."""

    def __init__(self, held: int, protocol: str, refuses: bool = False) -> None:
        self.held, self.protocol, self.refuses, self.unregisters = held, protocol, refuses, 0

    def unregister_system_shared_memory(self, name: str, headers: Any = None) -> None:
        self.unregisters += 1
        if self.refuses and self.unregisters <= self.held:
            raise InferenceServerException(
                f"[StatusCode.INTERNAL] Cannot unregister shared memory region '{name}', it is currently in use.")

    def get_system_shared_memory_status(self, region_name: str = "", headers: Any = None) -> Any:
        if self.unregisters > self.held:
            raise InferenceServerException(f"Unable to find system shared memory region: '{region_name}'")
        if self.protocol == "http":
            return [{"name": region_name, "key": "/" + region_name, "offset": 0, "byte_size": 12}]

        class Status:
            regions = {region_name: object()}

        return Status()


@pytest.mark.parametrize("refuses", [False, True], ids=["marks", "refuses"])
@pytest.mark.parametrize("protocol", ["http", "grpc"])
def test_a_region_still_held_is_unregistered_again_until_it_is_gone(protocol: str, refuses: bool,
                                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shm.time, "sleep", lambda s: None)
    server = MarkingServer(held=2, protocol=protocol, refuses=refuses)
    shm.unregister(server, "r", {})
    assert server.unregisters == 3


def test_any_other_unregister_error_is_raised(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(shm.time, "sleep", lambda s: None)

    class Forbidden(MarkingServer):
        def unregister_system_shared_memory(self, name: str, headers: Any = None) -> None:
            raise InferenceServerException("[StatusCode.PERMISSION_DENIED] This API is restricted")

    with pytest.raises(InferenceServerException, match="restricted"):
        shm.unregister(Forbidden(held=0, protocol="grpc"), "r", {})


def test_a_region_that_stays_listed_is_reported_not_raised(monkeypatch: pytest.MonkeyPatch,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setattr(shm.time, "sleep", lambda s: None)
    server = MarkingServer(held=100, protocol="grpc")
    shm.unregister(server, "r", {})
    assert server.unregisters == len(shm.UNREGISTER_BACKOFF_S)
    assert "still lists shared-memory region r" in caplog.text
