"""Autoscalers that come with worker-core.

Public (see :mod:`worker_core`): :class:`DemandAutoscaler`, the default, which an autoscaler of
one's own may build on (as the backlog autoscaler does).
"""

from .default import DemandAutoscaler

__all__ = ["DemandAutoscaler"]
