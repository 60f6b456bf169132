"""The asyncio pool for worker: ``async def`` tasks by the thousand on an event loop per process."""

from .pool import AsyncioPool

__all__ = ["AsyncioPool"]
