"""worker: a task-queue worker whose every moving part is a plugin."""

from .bootsteps import Condition, Step
from .hookspecs import hookimpl
from .options import OptionSpec, WorkerOptions

__all__ = ["Condition", "OptionSpec", "Step", "WorkerOptions", "hookimpl"]
