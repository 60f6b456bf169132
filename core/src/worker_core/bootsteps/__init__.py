"""Bootsteps: declaring steps, resolving them into a graph, running and rendering it.

Internal to worker-core (see :mod:`worker_core` for the public API).
"""

from typing import Any

from .blueprint import Blueprint
from .graph import Edge, Provider, StepGraph, resolve
from .render import render as _render
from .step import Condition, Step

FORMATS = ("dot", "mermaid", "text", "json")


def render(*args: Any, **kwargs: Any) -> str:
    """Render resolved blueprints (see :func:`worker_core.bootsteps.render.render`)."""
    return _render(*args, **kwargs)

__all__ = ["FORMATS", "Blueprint", "Condition", "Edge", "Provider", "Step", "StepGraph", "render", "resolve"]
