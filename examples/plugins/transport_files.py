"""A transport plugin: queues kept as files in a folder, through kombu's filesystem transport.

Served under the URL scheme ``files`` (``files:///var/spool/tasks``): its entry point would be
``files = transport_files:FilesTransport`` in the group ``worker.transports``. Run as a program,
it checks itself with the transport contract suite against a folder of its own.
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, ClassVar
from urllib.parse import urlsplit

from kombu.transport import filesystem, virtual

from worker_core import Settings
from worker_core.exceptions import ConfigurationError


class _Message(virtual.Message):
    """A message that says it was delivered before: kombu's filesystem transport marks a message
    it gives back (``redelivered`` in the file) and does not pass the mark on."""

    def __init__(self, payload: Any, channel: Any = None, **kwargs: Any) -> None:
        super().__init__(payload, channel=channel, **kwargs)
        if payload.get("redelivered"):
            self.delivery_info["redelivered"] = True
            if isinstance(self.headers, dict):
                self.headers["redelivered"] = True  # where kombu's Redis transport puts it


class _Channel(filesystem.Channel):
    Message = _Message


class _KombuTransport(filesystem.Transport):
    Channel = _Channel


class FilesTransport:
    """Every message is a file in ``<folder>/out`` until a worker takes it."""

    supports_async: ClassVar[bool] = False  # kombu's filesystem transport is polled: the sync loop

    def __init__(self, url: str, settings: Settings) -> None:
        folder = urlsplit(url).path
        if not folder or not os.path.isdir(folder):
            raise ConfigurationError(f"files:// needs an existing folder, for example "
                                     f"files:///var/spool/tasks (got {url!r})")
        self.folder = Path(folder)
        self.options = dict(settings.broker_transport_options)

    def kombu_transport(self) -> Any:
        return _KombuTransport

    def connection_options(self) -> Mapping[str, Any]:
        folder = str(self.folder)
        # the exchanges' tables too (kombu's default is ./control, in whatever folder the worker runs in)
        options = {"data_folder_in": folder, "data_folder_out": folder,
                   "control_folder": str(self.folder / "control"), "polling_interval": 0.05}
        return {"transport_options": {**options, **self.options}}

    def queue_depth(self, connection: Any, queue: str) -> int:
        return sum(1 for name in os.listdir(self.folder) if name.endswith(f".{queue}.msg"))


if __name__ == "__main__":
    from worker_core.testing import transport_contract

    with tempfile.TemporaryDirectory() as folder:
        transport_contract.run_all(FilesTransport, f"files://{folder}")
    print("FilesTransport passes the transport contract")
