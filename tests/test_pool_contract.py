"""Every pool honours the pool contract, driven directly (sync loop) and by a kombu hub (async loop)."""

from __future__ import annotations

import pytest

from worker_core.pools.solo import SoloPool
from worker_core.slots import PoolFactory
from worker_core.testing import pool_contract
from worker_pool_asyncio import AsyncioPool
from worker_pool_prefork import PreforkPool
from worker_pool_threads import ThreadPool

POOLS = {"solo": SoloPool, "threads": ThreadPool, "prefork": PreforkPool, "asyncio": AsyncioPool}


@pytest.mark.parametrize("check", pool_contract.CHECKS, ids=pool_contract.check_name)
@pytest.mark.parametrize("hub", [False, True], ids=["direct", "hub"])
@pytest.mark.parametrize("pool", sorted(POOLS))
def test_pool_honours_the_pool_contract(pool: str, hub: bool, check: pool_contract.Check) -> None:
    factory: PoolFactory = POOLS[pool]
    check(factory, hub=hub)


def test_run_all_names_the_pool_and_the_failing_check() -> None:
    class WrongPool(SoloPool):
        """Reports the wrong result: the contract must say so, naming the pool and the check."""

        def apply_async(self, target, args=(), kwargs=None, **callbacks):  # type: ignore[no-untyped-def]
            callbacks["accept_callback"](1, 0.0)
            callbacks["callback"]("wrong")

    with pytest.raises(AssertionError, match=r"WrongPool fails check_result_reaches_callback .*'wrong'"):
        pool_contract.run_all(WrongPool, only=["result_reaches_callback"])


def test_run_all_names_a_pool_that_offers_a_capability_by_halves() -> None:
    class HalfShared(SoloPool):
        """Says its executors share one queue, but cannot give queued jobs back."""

        shared_queue = True

    with pytest.raises(AssertionError, match=r"HalfShared fails check_the_pool_satisfies_the_pool_protocol .*"
                                             r"has shared_queue but lacks withdraw_queued"):
        pool_contract.run_all(HalfShared, only=["the_pool_satisfies_the_pool_protocol"])
