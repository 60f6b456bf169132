"""Checks the example plugin's ``timed`` pool with the pool contract suite, driven directly (the
sync loop) and on a kombu hub (the async loop), as the worker drives a pool.

    python examples/plugins/check_timed_pool.py
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "plugin" / "src"))

from worker_liveness.pool import TimedPool

from worker_core.testing import pool_contract

if __name__ == "__main__":
    pool_contract.run_all(TimedPool)
    pool_contract.run_all(TimedPool, hub=True)
    print("TimedPool passes the pool contract")
