"""An autoscaler for worker that also reads the broker's queue depth."""

from .autoscaler import BacklogAutoscaler

__all__ = ["BacklogAutoscaler"]
