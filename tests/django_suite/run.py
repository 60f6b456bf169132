"""Runs Django's own tests of its task backends (``tests/tasks`` of Django's source, at
DJANGO_SOURCE_TESTS) with worker_django's backends in place of Django's: ``ImmediateBackend`` is
:class:`suite_backends.RunByWorker` (a real worker runs each task), ``DummyBackend`` is
:class:`suite_backends.Queued` (each task stays on a broker no worker consumes); see
:mod:`suite_backends`. Django's test runner runs them, with the settings :mod:`suite_settings`.

    python run.py --list OUT.json MODULE...   the ids of the tests of Django's test modules
    python run.py OUT.json TEST_ID...         run them: {id: [outcome, detail]} into OUT.json

Its directory and DJANGO_SOURCE_TESTS are put on the path; the tests are imported after the
classes are replaced, so the names they import are the replacements too.
"""

from __future__ import annotations

import json
import os
import sys
import unittest
from pathlib import Path
from typing import Any, ClassVar


def _setup() -> None:
    here = Path(__file__).resolve().parent
    # Django's tests, this directory, and the suite's helpers (tests/workers.py)
    sys.path[:0] = [os.environ["DJANGO_SOURCE_TESTS"], str(here), str(here.parent)]
    os.environ["DJANGO_SETTINGS_MODULE"] = "suite_settings"
    import django
    from django.tasks.backends import dummy, immediate
    from suite_backends import Queued, RunByWorker

    dummy.DummyBackend = Queued
    immediate.ImmediateBackend = RunByWorker
    django.setup()


def _ids(suite: unittest.TestSuite) -> list[str]:
    found = []
    for test in suite:
        if isinstance(test, unittest.TestSuite):
            found.extend(_ids(test))
        else:
            found.append(test.id())
    return found


class Recorded(unittest.TextTestResult):
    """A ``TextTestResult`` that also keeps each test's outcome by its id."""

    outcomes: ClassVar[dict[str, list[str]]] = {}

    def _put(self, test: Any, outcome: str, detail: str = "") -> None:
        if self.outcomes.get(test.id(), ["passed"])[0] == "passed":
            self.outcomes[test.id()] = [outcome, detail]

    def addSuccess(self, test: Any) -> None:
        super().addSuccess(test)
        self._put(test, "passed")

    def addFailure(self, test: Any, err: Any) -> None:
        super().addFailure(test, err)
        self._put(test, "failed", self._exc_info_to_string(err, test))

    def addError(self, test: Any, err: Any) -> None:
        super().addError(test, err)
        self._put(test, "error", self._exc_info_to_string(err, test))

    def addSkip(self, test: Any, reason: str) -> None:
        super().addSkip(test, reason)
        self._put(test, "skipped", reason)

    def addSubTest(self, test: Any, subtest: Any, err: Any) -> None:
        super().addSubTest(test, subtest, err)
        if err is not None:
            self._put(test, "failed", f"{subtest.id()}:\n{self._exc_info_to_string(err, test)}")


def main(argv: list[str]) -> int:
    _setup()
    from django.test.runner import DiscoverRunner

    class Runner(DiscoverRunner):
        def get_resultclass(self) -> Any:
            return Recorded

    if argv[0] == "--list":
        out, labels = Path(argv[1]), argv[2:]
        out.write_text(json.dumps(_ids(Runner(verbosity=0).build_suite(labels))))
        return 0
    out, labels = Path(argv[0]), argv[1:]
    runner = Runner(verbosity=2, interactive=False)
    failures = runner.run_tests(labels)
    out.write_text(json.dumps(Recorded.outcomes))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
