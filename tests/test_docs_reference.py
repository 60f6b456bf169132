"""The reference of the documentation site is complete: every setting, hook, slot Protocol,
command, option, plugin option and remote-control command has a description in the code, which
the reference pages are generated from (``docs/reference.py``, mkdocstrings)."""

from __future__ import annotations

import inspect
import sys
from typing import Any

import pytest
from conftest import REPO

sys.path.insert(0, str(REPO / "docs"))
import reference

PAGES = REPO / "docs" / "reference"


def _described(text: str | None, name: str = "") -> bool:
    """A real description: two words or more, not only the name again."""
    words = (text or "").replace(name, "").split()
    return len(words) >= 2


def test_every_setting_has_a_description_beside_its_field():
    missing = [e.name for e in reference.settings_entries() if not _described(e.description, e.name)]
    assert not missing, (
        f"settings without a description: {missing}; write it in a '#:' comment above the field in "
        f"worker_core/app/settings.py (the reference is generated from it)")


def test_the_settings_celery_lacks_are_exactly_those_marked_as_this_workers_own():
    from celery.app.defaults import DEFAULTS

    from worker_core.app.settings import OWN_SETTINGS, Settings

    lacking = {name for name in Settings.names() if name not in DEFAULTS}
    assert lacking == set(OWN_SETTINGS), (
        f"OWN_SETTINGS in worker_core/app/settings.py must name the settings Celery does not have: "
        f"add {sorted(lacking - OWN_SETTINGS)}, remove {sorted(OWN_SETTINGS - lacking)}")


def test_the_settings_reference_has_an_entry_with_type_default_and_variable_for_each_setting():
    from worker_core.app.settings import Settings

    text = reference.settings_markdown()
    for name in Settings.names():
        assert f"#### `{name}` {{ #{name} }}" in text
        assert f"`WORKER_{name.upper()}`" in text
    assert "<!-- generated: settings -->" in (PAGES / "settings.md").read_text()


def _hookspecs() -> dict[str, Any]:
    from worker_core import hookspecs

    return {name: value for name, value in vars(hookspecs).items()
            if callable(value) and hasattr(value, f"{hookspecs.PROJECT}_spec")}


def test_every_hook_is_specified_with_a_docstring_and_on_the_hooks_page():
    specs = _hookspecs()
    assert len(specs) > 20
    missing = [name for name, spec in specs.items() if not _described(inspect.getdoc(spec))]
    assert not missing, f"hookspecs without a docstring in worker_core/hookspecs.py: {missing}"
    assert "::: worker_core.hookspecs" in (PAGES / "hooks.md").read_text()


def _protocols() -> dict[str, type]:
    from worker_core import slots

    return {name: value for name, value in vars(slots).items()
            if inspect.isclass(value) and value.__module__ == slots.__name__
            and getattr(value, "_is_protocol", False)}


def test_every_slot_protocol_and_its_methods_have_docstrings_and_are_on_the_slots_page():
    protocols = _protocols()
    slots = {"Pool", "Transport", "ResultBackend", "EventLoop", "Autoscaler", "FailoverStrategy"}
    assert slots <= set(protocols)
    missing = []
    for name, protocol in protocols.items():
        if not _described(protocol.__doc__):
            missing.append(name)
        for member, value in vars(protocol).items():
            if not member.startswith("_") and inspect.isfunction(value) and not _described(value.__doc__):
                missing.append(f"{name}.{member}")
    assert not missing, f"slot Protocols or methods without a docstring in worker_core/slots.py: {missing}"
    assert "::: worker_core.slots" in (PAGES / "slots.md").read_text()


def test_every_command_and_option_of_workerctl_has_help():
    import click

    missing = []
    commands = list(reference.cli_commands())
    assert {"workerctl worker", "workerctl steps", "workerctl inspect", "workerctl control"} <= \
        {name for name, _ in commands}
    for name, command in commands:
        if not _described(command.help):
            missing.append(name)
        missing += [f"{name} {option.flags}" for option in reference.command_options(name, command)
                    if not _described(option.help)]
        assert all(isinstance(p, (click.Option, click.Argument)) for p in command.params)
    assert not missing, f"commands or options without help text: {missing}"
    assert "<!-- generated: cli -->" in (PAGES / "cli.md").read_text()


def test_every_option_an_installed_plugin_declares_has_help():
    options = reference.plugin_options()
    expected = {"--metrics-listen", "--child-scheduler", "-E, --task-events, --events"}
    assert expected <= {o.flags for o in options}
    missing = [f"{o.flags} ({o.plugin})" for o in options if not _described(o.help)]
    assert not missing, f"plugin options (OptionSpec) without help: {missing}"
    assert "<!-- generated: plugin-options -->" in (PAGES / "cli.md").read_text()


def test_every_remote_control_command_has_help():
    from worker_core.control.commands import BUILTIN_COMMANDS

    missing = [name for name, command in BUILTIN_COMMANDS.items() if not _described(command.help)]
    assert not missing, f"remote-control commands without help: {missing}"
    text = reference.control_commands_markdown()
    assert all(f"| `{name}` |" in text for name in BUILTIN_COMMANDS)
    assert "<!-- generated: control-commands -->" in (PAGES / "cli.md").read_text()


def test_an_unknown_generated_table_is_an_error():
    with pytest.raises(ValueError, match="unknown generated table 'nothing'"):
        reference.generate("<!-- generated: nothing -->")


def test_the_readme_stays_short_and_its_links_into_the_site_resolve():
    import re

    readme = (REPO / "README.md").read_text()
    assert len(readme.splitlines()) <= 300, "the README stays short: features are documented in docs/"
    links = re.findall(r"\]\((docs/[^)#]+)(?:#[^)]*)?\)", readme)
    assert len(links) > 10
    missing = [link for link in links if not (REPO / link).is_file()]
    assert not missing, f"the README links to pages that do not exist: {missing}"
