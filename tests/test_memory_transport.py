"""A transport written on the public API alone passes the shipped transport contract suite."""

from __future__ import annotations

import pytest
from memory_transport import MemoryTransport

from worker_core.testing import transport_contract


@pytest.mark.parametrize("check", transport_contract.CHECKS, ids=transport_contract.check_name)
def test_a_transport_of_the_public_api_alone_honours_the_transport_contract(check) -> None:
    check(MemoryTransport, "memory://")
