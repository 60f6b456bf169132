"""The reference pages' tables, generated from the code so they cannot drift from it.

``docs/hooks.py`` puts them into the pages at build time (a line ``<!-- generated: NAME -->``
becomes the table NAME); ``tests/test_docs_reference.py`` checks through the same functions that
every setting, command, option, remote-control command and plugin option has a description in
the code.
"""

from __future__ import annotations

import ast
import inspect
import subprocess
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import attrs
import click

__all__ = ["GENERATED", "OptionEntry", "SettingEntry", "cli_commands", "generate", "settings_entries"]


# -- settings --------------------------------------------------------------------------------


@attrs.frozen
class SettingEntry:
    name: str
    section: str
    type: str
    default: str
    variable: str
    celery: str | None  # Celery's name for it, None when Celery has no such setting
    description: str


def _comments_and_sections(source: str) -> tuple[dict[str, str], dict[str, str]]:
    """Each field of ``Settings`` with the ``#:`` comment above it, and the ``# -- name`` banner
    it stands under."""
    lines = source.splitlines()
    tree = ast.parse(source)
    cls = next(node for node in tree.body if isinstance(node, ast.ClassDef) and node.name == "Settings")
    comments: dict[str, str] = {}
    sections: dict[str, str] = {}
    section = ""
    previous_end = cls.lineno
    for node in cls.body:
        for line in lines[previous_end:node.lineno - 1]:
            if line.strip().startswith("# --"):
                section = line.strip()[4:].strip()
        if isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            index = node.lineno - 2
            text: list[str] = []
            while index >= 0 and lines[index].strip().startswith("#:"):
                text.insert(0, lines[index].strip()[2:].strip())
                index -= 1
            comments[node.target.id] = " ".join(text)
            sections[node.target.id] = section
        previous_end = node.end_lineno or node.lineno
    return comments, sections


def _default_text(field: attrs.Attribute[Any]) -> str:
    default = field.default
    if isinstance(default, attrs.Factory):  # type: ignore[arg-type]
        default = default.factory()  # type: ignore[union-attr]
    return repr(default)


def settings_entries() -> list[SettingEntry]:
    """Every setting, in the order ``Settings`` declares them."""
    from worker_core.app import settings as module

    comments, sections = _comments_and_sections(Path(inspect.getfile(module)).read_text())
    entries = []
    for field in attrs.fields(module.Settings):
        entries.append(SettingEntry(
            name=field.name,
            section=sections.get(field.name, ""),
            type=str(field.type),
            default=_default_text(field),
            variable=module.ENV_PREFIX + field.name.upper(),
            celery=None if field.name in module.OWN_SETTINGS else field.name,
            description=comments.get(field.name, ""),
        ))
    return entries


def _cell(text: str) -> str:
    return text.replace("|", "\\|").replace("\n", " ")


def _literal(text: str) -> str:
    """Help text as Markdown: its brackets are literal (``[EXCHANGE] [TYPE]`` would read as a link)."""
    return text.replace("[", "\\[").replace("]", "\\]")


def _text(text: str) -> str:
    """Help text in a table cell."""
    return _literal(_cell(text))


def _code(text: str) -> str:
    return f"`{_cell(text)}`" if text else ""


def settings_markdown() -> str:
    out: list[str] = []
    section = None
    for entry in settings_entries():
        if entry.section != section:
            section = entry.section
            out += ["", f"### {section.capitalize() or 'Other'}", "",
                    "| setting | type | default | environment variable | Celery |", "|---|---|---|---|---|"]
        celery = "same name" if entry.celery else "none: this worker's own"
        out.append(f"| [`{entry.name}`](#{entry.name}) | {_code(entry.type)} | {_code(entry.default)} | "
                   f"{_code(entry.variable)} | {celery} |")
    out += ["", "### Each setting", ""]
    for entry in settings_entries():
        out += [f"#### `{entry.name}` {{ #{entry.name} }}", "", _inline_roles(entry.description), "",
                f"Type `{entry.type}`, default `{entry.default}`, variable `{entry.variable}`; "
                + (f"Celery: `{entry.celery}`." if entry.celery else "Celery has no such setting."), ""]
    return "\n".join(out)


# -- the command line ------------------------------------------------------------------------


@attrs.frozen
class OptionEntry:
    command: str
    flags: str
    value: str
    default: str
    help: str


def cli_commands() -> Iterator[tuple[str, click.Command]]:
    """``workerctl`` and each of its commands (a group's commands after it), by full name."""
    from worker_core.cli.group import main

    yield "workerctl", main
    context = click.Context(main, info_name="workerctl")

    def walk(prefix: str, group: click.Group) -> Iterator[tuple[str, click.Command]]:
        for name in group.list_commands(context):
            command = group.get_command(context, name)
            if command is None:
                continue
            yield f"{prefix} {name}", command
            if isinstance(command, click.Group):
                yield from walk(f"{prefix} {name}", command)

    yield from walk("workerctl", main)


def command_options(name: str, command: click.Command) -> list[OptionEntry]:
    """The command's own options (the plugins' are listed apart, by :func:`plugin_options`)."""
    from worker_core.cli.common import PluginCommand

    entries = []
    for param in command.core_params if isinstance(command, PluginCommand) else command.params:
        if not isinstance(param, click.Option):
            continue
        flags = ", ".join(param.opts + param.secondary_opts)
        value = "" if param.is_flag else param.metavar or param.type.name.upper()
        default = param.default
        unset = default is None or type(default).__name__ == "Sentinel" or default in (False, ())
        default = "" if unset or param.is_flag else repr(default)
        entries.append(OptionEntry(name, flags, value, default, param.help or ""))
    return entries


def command_arguments(command: click.Command) -> list[str]:
    return [(f"[{param.human_readable_name}]..." if param.nargs == -1 else param.human_readable_name)
            for param in command.params if isinstance(param, click.Argument)]


def cli_markdown() -> str:
    out: list[str] = []
    for name, command in cli_commands():
        arguments = " ".join(command_arguments(command))
        out += [f"### `{name}`", "", f"```text\n{name} [OPTIONS]{' ' + arguments if arguments else ''}"
                + (" COMMAND [ARGS]..." if isinstance(command, click.Group) else "") + "\n```", "",
                _literal(inspect.cleandoc(command.help or "")), ""]
        options = command_options(name, command)
        if options:
            out += ["| option | value | default | what |", "|---|---|---|---|"]
            out += [f"| `{_cell(o.flags)}` | {_code(o.value)} | {_code(o.default)} | {_text(o.help)} |"
                    for o in options]
            out.append("")
    return "\n".join(out)


@attrs.frozen
class PluginOptionEntry:
    flags: str
    name: str
    variable: str
    default: str
    plugin: str
    distribution: str
    help: str


def plugin_options() -> list[PluginOptionEntry]:
    """The options the installed plugins add to ``workerctl worker`` and ``workerctl steps``."""
    from worker_core import OptionSpec
    from worker_core.plugins.manager import PluginManager

    manager = PluginManager()
    found = []
    for specs, provider in manager.collect("worker_options"):
        for spec in specs or ():
            if isinstance(spec, OptionSpec):
                found.append(PluginOptionEntry(
                    flags=", ".join(spec.flags), name=spec.name, variable=f"WORKER_{spec.name.upper()}",
                    default="" if spec.default is None else repr(spec.default), plugin=provider.plugin,
                    distribution=provider.distribution or "", help=spec.help))
    return found


def plugin_options_markdown() -> str:
    out = ["| option | variable | default | plugin (distribution) | what |", "|---|---|---|---|---|"]
    out += [f"| `{_cell(o.flags)}` | `{o.variable}` | {_code(o.default)} | {o.plugin} ({o.distribution}) | "
            f"{_text(o.help)} |" for o in plugin_options()]
    return "\n".join(out)


def control_commands_markdown() -> str:
    from worker_core.control.commands import BUILTIN_COMMANDS

    out = ["| command | kind | arguments | what |", "|---|---|---|---|"]
    for command in BUILTIN_COMMANDS.values():
        arguments = command.usage
        out.append(f"| `{command.name}` | {command.kind} | {_code(arguments)} | {_text(command.help)} |")
    return "\n".join(out)


def entry_points_markdown() -> str:
    from worker_core.plugins.entrypoints import HOOKS_GROUP, SLOT_CHOICE, SLOT_GROUPS

    out = ["| entry-point group | what it holds | chosen by |", "|---|---|---|",
           f"| `{HOOKS_GROUP}` | plugins that take part through hooks (bootsteps, options, events) | "
           f"installed: every one is loaded, unless blocked with `-p no:NAME` |"]
    out += [f"| `{group}` | the {kind.replace('_', ' ')} slot's implementations | "
            f"{_cell(SLOT_CHOICE[kind])} |"
            for kind, group in SLOT_GROUPS.items()]
    return "\n".join(out)


def redis_cluster_options_markdown() -> str:
    """The Redis Cluster transport's ``broker_transport_options`` and its result backend's
    ``result_backend_transport_options``, from the mappings the plugin checks them with."""
    from worker_transport_redis_cluster.options import BACKEND_OPTIONS, BROKER_OPTIONS, PASSED

    out = ["| option | default | what |", "|---|---|---|"]
    out += [f"| `{name}` | {_code(repr(default))} | {_text(what)} |"
            for name, (default, what) in BROKER_OPTIONS.items()]
    out += ["", f"kombu's own, passed on as they are: {', '.join(f'`{name}`' for name in sorted(PASSED))}.",
            "", "`result_backend_transport_options`:", "",
            "| option | default | what |", "|---|---|---|"]
    out += [f"| `{name}` | {_code(repr(default))} | {_text(what)} |"
            for name, (default, what) in BACKEND_OPTIONS.items()]
    return "\n".join(out)


def steps_graph_markdown() -> str:
    """The bootstep graph of a worker with the default options, drawn by ``workerctl steps
    --graph --format mermaid`` when the site is built."""
    done = subprocess.run([sys.executable, "-m", "worker_core", "steps", "--graph", "--format", "mermaid"],
                          capture_output=True, text=True, check=True, timeout=60)
    return f"```mermaid\n{done.stdout.strip()}\n```"


def _inline_roles(text: str) -> str:
    """Sphinx roles written in comments (``:mod:`x```) as code."""
    import re

    return re.sub(r":(?:mod|class|func|data|meth|attr):`~?([^`]+)`", r"`\1`", text)


GENERATED: dict[str, Callable[[], str]] = {
    "settings": settings_markdown,
    "cli": cli_markdown,
    "plugin-options": plugin_options_markdown,
    "control-commands": control_commands_markdown,
    "entry-points": entry_points_markdown,
    "steps-graph": steps_graph_markdown,
    "redis-cluster-options": redis_cluster_options_markdown,
}


def generate(markdown: str) -> str:
    """``markdown`` with each ``<!-- generated: NAME -->`` line replaced by its table."""
    out = []
    for line in markdown.splitlines():
        stripped = line.strip()
        if stripped.startswith("<!-- generated:") and stripped.endswith("-->"):
            name = stripped[len("<!-- generated:"):-3].strip()
            if name not in GENERATED:
                raise ValueError(f"unknown generated table {name!r}; known: {', '.join(GENERATED)}")
            out.append(GENERATED[name]())
        else:
            out.append(line)
    return "\n".join(out) + "\n"
