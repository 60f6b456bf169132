"""Bootsteps: declaring steps, resolving them into a graph, running and rendering it."""

from .blueprint import Blueprint
from .graph import Edge, Provider, StepGraph, resolve
from .render import FORMATS, render
from .step import Condition, Step

__all__ = ["Blueprint", "Condition", "Edge", "FORMATS", "Provider", "Step", "StepGraph", "render", "resolve"]
