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


def race(jobs: int, seed: int) -> tuple[set[int], set[int]]:
    """A child claims jobs 1..jobs in order, as a pool child does, while the parent takes back
    growing prefixes; the jobs the child started and those the parent took back."""
    claims = Claims()
    go_read, go_write = os.pipe()
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.close(read_end)
            os.read(go_read, 1)
            verdicts = bytearray()
            for job in range(1, jobs + 1):
                verdicts.append(claims.claim(job))
                if job % 64 == 0:
                    os.sched_yield()
            with os.fdopen(write_end, "wb") as out:
                out.write(verdicts)
        finally:
            os._exit(0)
    os.close(write_end)
    withdrawn: set[int] = set()
    rng = random.Random(seed)
    newest = 0
    try:
        os.write(go_write, b"!")
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
        for fd in (go_read, go_write):
            os.close(fd)
        claims.close()
    assert len(verdicts) == jobs
    return {job for job, verdict in enumerate(verdicts, start=1) if verdict}, withdrawn


def test_racing_claims_and_withdrawals_decide_every_job_exactly_once() -> None:
    jobs = 20000
    for seed in range(5):  # a run where one side finished before the other began proves little
        started, withdrawn = race(jobs, seed)
        assert not started & withdrawn, f"{len(started & withdrawn)} jobs both started and taken back"
        assert started | withdrawn == set(range(1, jobs + 1)), "some job was neither started nor taken back"
        if started and withdrawn:
            break
    else:
        raise AssertionError("in five runs the child and the parent never raced")
    print(f"{len(started)} started, {len(withdrawn)} taken back", file=sys.stderr)
