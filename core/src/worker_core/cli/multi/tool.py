"""What each ``multi`` command does, and what it prints (``celery multi``'s lines)."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import TextIO

from ..daemon import alive
from .nodes import Node, make_directories

__all__ = ["COMMANDS", "USAGE", "Tool"]

USAGE = """\
usage: {prog} start <node1 node2 nodeN|range> [worker options]
       {prog} stop <n1 n2 nN|range> [-SIG (default: -TERM)]
       {prog} stopwait <n1 n2 nN|range> [-SIG (default: -TERM)]
       {prog} restart <n1 n2 nN|range> [-SIG] [worker options]
       {prog} kill <n1 n2 nN|range>

       {prog} show <n1 n2 nN|range> [worker options]
       {prog} get hostname <n1 n2 nN|range> [worker options]
       {prog} names <n1 n2 nN|range>
       {prog} expand template <n1 n2 nN|range>
       {prog} help

per-node options: -c:w1 4, -Q:w2 emails, by index -c:1 4, list -c:1,2 or range -c:1-3
pid and log files: --pidfile=/var/run/celery/%n.pid --logfile=/var/log/celery/%n%I.log (defaults)

additional options (after the command name):
    --nosplash   no program line
    --quiet, -q  less output
    --verbose    show each node's command line
    --no-color   no colours (none are printed)
"""

#: seconds between checks that stopping nodes are gone (``celery multi`` waits 2 s)
POLL_SECONDS = 0.5
#: print a progress dot this often while waiting
DOT_SECONDS = 2.0


def _signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name.removeprefix("SIG")
    except ValueError:
        return str(signum)


class Tool:
    """Runs one ``multi`` command over nodes, printing as ``celery multi`` prints."""

    def __init__(self, *, quiet: bool = False, verbose: bool = False, out: TextIO | None = None,
                 err: TextIO | None = None) -> None:
        self.quiet = quiet
        self.verbose = verbose
        self.out = out or sys.stdout
        self.err = err or sys.stderr

    def say(self, text: str, newline: bool = True) -> None:
        print(text, file=self.out, end="\n" if newline else "", flush=True)

    def note(self, text: str, newline: bool = True) -> None:
        if not self.quiet:
            self.say(text, newline)

    # -- starting ----------------------------------------------------------------------------

    def start_node(self, node: Node) -> int:
        self.note(f"\t> {node.name}: ", newline=False)
        make_directories(node)
        command = [node.executable, *node.argv]
        if self.verbose:
            self.note(f"\n  {' '.join(command)}")
        code = subprocess.call(command)
        if code < 0:
            self.note(f"* Child was terminated by signal {-code}")
        elif code > 0:
            self.note(f"* Child terminated with exit code {code}")
        self.note("FAILED" if code else "OK")
        return code

    def start(self, nodes: Sequence[Node], signum: int) -> int:
        self.note("> Starting nodes...")
        return int(any([self.start_node(node) for node in nodes]))

    # -- stopping ----------------------------------------------------------------------------

    def _running(self, nodes: Sequence[Node], on_down: Callable[[Node], None]) -> list[tuple[Node, int]]:
        running = []
        for node in nodes:
            pid = node.pid()
            if pid:
                running.append((node, pid))
            else:
                on_down(node)
        return running

    def _shutdown(self, nodes: Sequence[Node], signum: int, *, wait: bool,
                  on_down: Callable[[Node], None]) -> None:
        running = self._running(nodes, on_down)
        if not running:
            return
        self.note("> Stopping nodes...")
        waiting = []
        for node, pid in running:
            self.note(f"\t> {node.name}: {_signal_name(signum)} -> {pid}")
            if node.send(signum):
                waiting.append((node, pid))
            else:
                self.note(f"Could not signal {node.name} ({pid}): No such process")
                on_down(node)
        if not wait or not waiting:
            return
        self.note(f"> Waiting for {len(waiting)} node{'s' if len(waiting) != 1 else ''} -> "
                  f"{', '.join(str(pid) for _, pid in waiting)}...", newline=False)
        last_dot = time.monotonic()
        while waiting:
            for entry in list(waiting):
                if not alive(entry[1]):  # the process itself: it removes its pid file before it ends
                    waiting.remove(entry)
                    self.note(f"\n\t> {entry[0].name}: OK")
                    on_down(entry[0])
            if waiting:
                time.sleep(POLL_SECONDS)
                if time.monotonic() - last_dot >= DOT_SECONDS:
                    self.note(".", newline=False)
                    last_dot = time.monotonic()
        self.note("")

    def _down(self, node: Node) -> None:
        self.note(f"> {node.name}: DOWN")

    def stop(self, nodes: Sequence[Node], signum: int) -> int:
        self._shutdown(nodes, signum, wait=False, on_down=self._down)
        return 0

    def stopwait(self, nodes: Sequence[Node], signum: int) -> int:
        self._shutdown(nodes, signum, wait=True, on_down=self._down)
        return 0

    def restart(self, nodes: Sequence[Node], signum: int) -> int:
        codes = []

        def start_again(node: Node) -> None:
            self.note(f"> Restarting node {node.name}: ", newline=False)
            make_directories(node)
            code = subprocess.call([node.executable, *node.argv])
            self.note("FAILED" if code else "OK")
            codes.append(code)

        self._shutdown(nodes, signum, wait=True, on_down=start_again)
        return int(any(codes))

    def kill(self, nodes: Sequence[Node], signum: int) -> int:
        for node in nodes:
            pid = node.pid()
            if not pid:
                self._down(node)
                continue
            self.note(f"Sending KILL to node {node.name} ({pid})")
            if not node.send(signal.SIGKILL):
                self.note(f"Could not signal {node.name} ({pid}): No such process")
        return 0

    # -- showing -----------------------------------------------------------------------------

    def names(self, nodes: Sequence[Node], signum: int) -> int:
        self.say("\n".join(node.name for node in nodes))
        return 0

    def show(self, nodes: Sequence[Node], signum: int) -> int:
        self.say("\n".join(" ".join([node.executable, *node.argv]) for node in nodes))
        return 0


#: commands that take nodes; ``get``, ``expand`` and ``help`` take a word first
COMMANDS = ("start", "stop", "stopwait", "stop_verify", "restart", "kill", "names", "show")
