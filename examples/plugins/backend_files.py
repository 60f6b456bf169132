"""A result backend plugin: each task's result is a file in a folder, in Celery's format.

Served under the URL scheme ``files`` (``result_backend='files:///var/lib/results'``): its entry
point would be ``files = backend_files:FilesBackend`` in the group ``worker.result_backends``.
Run as a program, it checks itself with the result backend contract suite in a folder of its
own.
"""

from __future__ import annotations

import os
import tempfile
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from worker_core import Settings
from worker_core.exceptions import ConfigurationError, ResultError, ResultTimeout
from worker_core.results import READY_STATES, ResultCodec, make_meta, pending_meta


class FilesBackend:
    """One file per task id, written whole and renamed into place, so a reader never sees half."""

    def __init__(self, url: str, settings: Settings) -> None:
        folder = urlsplit(url).path
        if not folder or not os.path.isdir(folder):
            raise ConfigurationError(f"files:// needs an existing folder, for example "
                                     f"files:///var/lib/results (got {url!r})")
        self.folder = Path(folder)
        self.extended = settings.result_extended
        self.codec = ResultCodec.from_settings(settings)

    def _path(self, task_id: str) -> Path:
        return self.folder / f"{task_id}.result"

    def store_result(self, task_id: str, result: Any, state: str, traceback: str | None = None,
                     request: Mapping[str, Any] | None = None, *, serializer: str | None = None) -> None:
        meta = make_meta(task_id, state, result, traceback, request, extended=self.extended)
        payload = self.codec.encode(meta, serializer)
        data = payload.encode() if isinstance(payload, str) else payload
        temporary = self.folder / f".{task_id}.{os.getpid()}.{time.monotonic_ns()}"
        try:
            temporary.write_bytes(data)
            os.replace(temporary, self._path(task_id))  # atomic: readers see the old file or the new
        except OSError as exc:
            raise ResultError(f"cannot store the result of task {task_id} in {self.folder}: {exc}") from exc

    def get_task_meta(self, task_id: str) -> Mapping[str, Any]:
        try:
            data = self._path(task_id).read_bytes()
        except FileNotFoundError:
            return pending_meta(task_id)
        return self.codec.decode(data, f"the result of task {task_id}")

    def wait_for(self, task_id: str, timeout: float | None = None,
                 interval: float = 0.5) -> Mapping[str, Any]:
        deadline = None if timeout is None else time.monotonic() + timeout
        pause = 0.005
        while True:
            meta = self.get_task_meta(task_id)
            if meta["status"] in READY_STATES:
                return meta
            if deadline is not None and time.monotonic() >= deadline:
                raise ResultTimeout(f"task {task_id} is not ready after {timeout}s (state {meta['status']})")
            time.sleep(pause)
            pause = min(pause * 2, interval)  # a file is polled: quickly at first, then every interval

    def on_task_call(self, task_id: str) -> None:
        pass  # nothing to subscribe to: wait_for polls the file

    def forget(self, task_id: str) -> None:
        self._path(task_id).unlink(missing_ok=True)

    def close(self) -> None:
        pass  # no connection to release


if __name__ == "__main__":
    from worker_core.testing import result_backend_contract

    with tempfile.TemporaryDirectory() as folder:
        result_backend_contract.run_all(FilesBackend, f"files://{folder}")
    print("FilesBackend passes the result backend contract")
