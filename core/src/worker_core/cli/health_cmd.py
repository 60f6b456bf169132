"""``workerctl health``: listed with the other commands; ``workerctl`` runs it before loading the
command-line library at all (see :func:`worker_core.cli.run`), so this command only answers when
it is called another way (``main(["health", ...])``)."""

from __future__ import annotations

import sys

import click

from ..health.probe import main

__all__ = ["health"]


@click.command(context_settings={"ignore_unknown_options": True, "allow_extra_args": True,
                                 "help_option_names": []})
@click.argument("args", nargs=-1, type=click.UNPROCESSED)
def health(args: tuple[str, ...]) -> None:
    """Answer a liveness, readiness or start-up probe from the worker's state file (exec probes)."""
    sys.exit(main(list(args)))
