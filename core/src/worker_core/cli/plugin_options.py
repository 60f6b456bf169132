"""Where a plugin's own options get their values: the command line, else the option's
``WORKER_<NAME>`` variable, else the ``worker_plugin_options`` setting, else the option's default.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Collection, Mapping
from typing import Any

import attrs

from ..bootsteps.graph import Provider
from ..exceptions import ConfigurationError
from ..options import OptionSpec, did_you_mean
from ..redaction import is_secret_name, redact_text, redact_value

__all__ = [
    "ENV_PREFIX",
    "SETTING",
    "SETTING_VARIABLE",
    "DeclaredOption",
    "configured_source",
    "resolve_plugin_options",
]

#: the prefix of the settings' variables (``app.settings.ENV_PREFIX``, not imported: that
#: module brings in the tasks API, which ``workerctl plugins`` does without)
ENV_PREFIX = "WORKER_"
#: the setting that maps option names to values
SETTING = "worker_plugin_options"
#: the variable that holds :data:`SETTING` as JSON
SETTING_VARIABLE = ENV_PREFIX + SETTING.upper()

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off", ""}


@attrs.frozen
class DeclaredOption:
    """An option a plugin declared through ``worker_options``, and the plugin that declared it."""

    spec: OptionSpec
    provider: Provider

    @property
    def variable(self) -> str:
        """The environment variable that sets it: ``WORKER_LIVENESS_FILE`` for ``liveness_file``."""
        return ENV_PREFIX + self.spec.name.upper()

    @property
    def default(self) -> Any:
        # click gave a flag that was not given False, not None; plugins test it that way
        return False if self.spec.is_flag and self.spec.default is None else self.spec.default

    def describe(self) -> str:
        flag = self.spec.flags[0] if self.spec.flags else self.spec.name
        return f"{flag} of plugin {self.provider}"


def configured_source(environ: Mapping[str, str] | None = None) -> str:
    """How to name the setting in an error: by its variable when the environment set it (the
    environment wins over the app's configuration)."""
    environ = os.environ if environ is None else environ
    return SETTING_VARIABLE if SETTING_VARIABLE in environ else f"setting {SETTING!r}"


def resolve_plugin_options(
    declared: Mapping[str, DeclaredOption],
    given: Mapping[str, Any],
    configured: Mapping[str, Any],
    *,
    environ: Mapping[str, str] | None = None,
    unavailable: Callable[[], Collection[str]] = tuple,
) -> dict[str, Any]:
    """The value of every declared option.

    :param declared: the options plugins declared, by name.
    :param given: command-line values, already converted; None (or missing) where not given.
    :param configured: the :data:`SETTING` setting.
    :param unavailable: the plugins that declared nothing because they are blocked or broken;
        asked only when :data:`SETTING` holds a name nobody declared, to say so.
    :raise ConfigurationError: a value its option's ``convert`` refuses, naming where it came
        from; a name in :data:`SETTING` that no plugin declares.
    """
    environ = os.environ if environ is None else environ
    source = configured_source(environ)
    _check_names(declared, configured, source, unavailable)
    values: dict[str, Any] = {}
    for name, option in declared.items():
        if given.get(name) is not None:
            values[name] = given[name]
        elif option.variable in environ:
            values[name] = _from_variable(option, environ[option.variable])
        elif name in configured:
            values[name] = _from_setting(option, configured[name], source)
        else:
            values[name] = option.default
    return values


def _check_names(declared: Mapping[str, DeclaredOption], configured: Mapping[str, Any], source: str,
                 unavailable: Callable[[], Collection[str]]) -> None:
    for name in configured:
        if name in declared:
            continue
        known = sorted(declared)
        listed = ", ".join(known) or "none"
        absent = sorted(unavailable())
        missing = (f"; blocked or broken plugins declare none ({', '.join(absent)}): unblock or fix "
                   f"them, or remove the name" if absent else "")
        raise ConfigurationError(
            f"{source} names {name!r}, which no installed plugin declares as an option."
            f"{did_you_mean(str(name), known)} Declared options: {listed}{missing}"
        )


def _from_variable(option: DeclaredOption, text: str) -> Any:
    where = f"{option.variable}={redact_value(option.spec.name, text)!r} ({option.describe()})"
    if option.spec.is_flag:
        lowered = text.strip().lower()
        if lowered in _TRUE or lowered in _FALSE:
            return lowered in _TRUE
        raise ConfigurationError(f"{where} must be true or false, 1 or 0, yes or no, on or off")
    if not text.strip():
        return option.default  # an empty variable turns off what the settings may have turned on
    return _convert(option, text, where)


def _from_setting(option: DeclaredOption, value: Any, source: str) -> Any:
    name = option.spec.name
    where = f"{source} gives {name}={redact_value(name, value)!r} ({option.describe()})"
    if option.spec.is_flag:
        if isinstance(value, bool):
            return value
        raise ConfigurationError(f"{where}, which must be true or false (got a {type(value).__name__})")
    if value is None:
        return option.default
    if not isinstance(value, (str, int, float)):
        raise ConfigurationError(
            f"{where}, which must be text or a number, as on the command line (got a {type(value).__name__})"
        )
    # ``convert`` is written for command-line text: a number from the settings is handed over as
    # the text it would have been there.
    return _convert(option, value if isinstance(value, str) else str(value), where)


def _convert(option: DeclaredOption, text: str, where: str) -> Any:
    try:
        return option.spec.convert(text)
    except (ValueError, TypeError) as exc:
        reason = str(exc) or type(exc).__name__
        if is_secret_name(option.spec.name):
            reason = redact_text(reason, [text])  # the plugin's message may quote the secret
        raise ConfigurationError(f"{where}: {reason}") from None
