"""What moves the parent's pipe I/O and timers: kombu's hub, or a selector loop of our own."""

from .base import Driver, TimerHandle
from .hub import HubDriver
from .selector import SelectorDriver

__all__ = ["Driver", "HubDriver", "SelectorDriver", "TimerHandle"]
