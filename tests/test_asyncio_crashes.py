"""Which job took a loop process of the asyncio pool down, from how it died, what its threads
were running and its crash report (``worker_pool_asyncio.crashes``)."""

from __future__ import annotations

import signal

import pytest

from worker_pool_asyncio.crashes import Marks, culprit

REPORT = (b"Fatal Python error: Segmentation fault\n\nThread 0x00000000000000aa (most recent call first):\n"
          b"  File \"x.py\", line 1 in wait\n\nCurrent thread 0x00000000000000bb (most recent call first):\n"
          b"  File \"tasks.py\", line 9 in crash\n")


def killed(signum: int) -> int:
    return signum  # a waitpid status: killed by that signal


def exited(code: int) -> int:
    return code << 8


@pytest.mark.parametrize(("status", "marks", "report", "blamed"), [
    (killed(signal.SIGSEGV), [(0xaa, 7), (0xbb, 9)], REPORT, 9),  # the crashing thread's job
    (killed(signal.SIGSEGV), [(0xaa, 7), (0xbb, 0)], REPORT, None),  # it ran no job then
    (killed(signal.SIGABRT), [(0xaa, 7), (0xbb, 0)], b"", 7),  # no report: the one job running
    (killed(signal.SIGSEGV), [(0xaa, 7), (0xbb, 8)], b"", None),  # no report, two running: nobody
    (exited(1), [(0xaa, 5), (0xbb, 0)], b"", 5),  # os._exit in a job
    (exited(0), [(0xaa, 5), (0xbb, 0)], b"", None),
    (killed(signal.SIGKILL), [(0xaa, 5), (0xbb, 0)], b"", None),  # from outside: the kernel, a person
    (None, [(0xaa, 5)], b"", None),  # reaped elsewhere
])
def test_the_job_blamed_for_a_dead_loop_process(status, marks, report, blamed):
    assert culprit(status, marks, report) == blamed


def test_marks_give_each_thread_a_slot_of_its_own_until_none_is_left():
    import threading

    marks = Marks(3)
    try:
        marks.loop_thread()
        slots: list[int] = []
        threads = [threading.Thread(target=lambda: slots.append(marks.thread_slot())) for _ in range(3)]
        for thread in threads:
            thread.start()
            thread.join()
        assert sorted(slots) == [-1, 1, 2]
        assert marks.pairs()[0][0] == threading.get_ident()
    finally:
        marks.close()
