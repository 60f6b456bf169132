"""The claims between the prefork parent and a child: every job is started by the child or taken
back by the parent, never both and never neither, however the two race."""

from __future__ import annotations

import os
import random
import sys

import pytest

from worker_pool_prefork.claims import Claims

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="the claims are shared through fork")


def test_a_job_taken_back_is_skipped_and_one_claimed_stays() -> None:
    claims = Claims()
    try:
        assert claims.claim(1) and claims.running_since() > 0.0
        claims.finished()
        assert claims.running_since() == 0.0
        assert claims.withdraw(3, 0.0) == 1  # jobs 2 and 3 taken back
        assert not claims.claim(2) and not claims.claim(3)
        assert claims.claim(4)
        assert claims.withdraw(3, 0.0) == 4  # nothing left to take back up to 3
        assert claims.withdraw(5, 0.0) == 4 and not claims.claim(5)
    finally:
        claims.close()


def test_a_lock_held_elsewhere_makes_withdraw_say_so_instead_of_waiting() -> None:
    claims = Claims()
    try:
        assert claims._lock.acquire(False)
        assert claims.withdraw(1, 0.0) is None
        assert claims.withdraw(1, 0.01) is None
        claims._lock.release()
        assert claims.withdraw(1, 0.0) == 0 and not claims.claim(1)
    finally:
        claims.close()


def test_racing_claims_and_withdrawals_decide_every_job_exactly_once() -> None:
    jobs = 20000
    claims = Claims()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child claims every job in order, as a pool child does
        try:
            os.close(read_end)
            verdicts = bytes(claims.claim(job) for job in range(1, jobs + 1))
            with os.fdopen(write_end, "wb") as out:
                out.write(verdicts)
        finally:
            os._exit(0)
    os.close(write_end)
    withdrawn: set[int] = set()
    rng = random.Random(7)
    newest = 0
    try:
        while newest < jobs:
            newest = min(jobs, newest + rng.randint(1, 3))
            claimed = claims.withdraw(newest, 0.0)
            if claimed is not None:
                withdrawn.update(range(claimed + 1, newest + 1))
            if rng.random() < 0.5:
                os.sched_yield()
        with os.fdopen(read_end, "rb") as source:
            verdicts = source.read()
    finally:
        os.waitpid(pid, 0)
        claims.close()
    started = {job for job, verdict in enumerate(verdicts, start=1) if verdict}
    assert len(verdicts) == jobs
    assert not started & withdrawn, f"{len(started & withdrawn)} jobs both started and taken back"
    assert started | withdrawn == set(range(1, jobs + 1)), "some job was neither started nor taken back"
    assert started and withdrawn, "the two sides never raced"
    print(f"{len(started)} started, {len(withdrawn)} taken back", file=sys.stderr)
