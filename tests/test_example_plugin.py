"""The example plugin in examples/plugin passes the pool contract suite shipped in the core."""

from __future__ import annotations

import sys

import pytest
from conftest import REPO

from worker_core.testing import pool_contract

sys.path.insert(0, str(REPO / "examples" / "plugin" / "src"))
from worker_liveness.pool import TimedPool


@pytest.mark.parametrize("check", pool_contract.CHECKS, ids=pool_contract.check_name)
@pytest.mark.parametrize("hub", [False, True], ids=["direct", "hub"])
def test_the_example_pool_honours_the_pool_contract(check, hub):
    check(TimedPool, hub=hub)


def test_the_example_pool_refuses_time_limits():
    from worker_core.exceptions import ConfigurationError
    from worker_core.slots import PoolOptions

    with pytest.raises(ConfigurationError, match="cannot enforce time limits"):
        TimedPool.check_options(PoolOptions(concurrency=1, time_limit=5))
