"""``Signature``: one task call as data, the dict Celery puts in a message (``task``, ``args``,
``kwargs``, ``options``, ``subtask_type``, ``immutable``); the kinds built of others (chain,
group, chord, ...) are its subclasses, registered by the name of their kind and rebuilt from
their dicts by :func:`from_dict`.

A signature is a ``dict``, so it serializes to exactly what Celery sends; what it knows besides
(its app and task object) lives in attributes, never in the dict. It sends with any app that is
a :class:`~.interface.CanvasApp`.

One module: the class is Celery's whole signature API (its keys as attributes, building,
freezing, callbacks, sending), which every kind inherits, with the registry of the kinds.
"""

from __future__ import annotations

import copy
import uuid
from collections.abc import Callable, Iterable, Mapping, MutableSequence, Sequence
from typing import Any, TypeVar

from ..exceptions import CanvasError, ConfigurationError
from ..protocol.message import safe_repr_as_built
from .interface import CanvasApp, CanvasTask

__all__ = ["IMMUTABLE_OPTIONS", "RUN_OPTIONS", "Signature", "as_list", "from_dict", "kind", "maybe_signature",
           "new_id", "register_type", "signature"]

#: Options a merge never replaces once a signature has them (Celery's ``_IMMUTABLE_OPTIONS``):
#: the group a task belongs to decides which chord counts it.
IMMUTABLE_OPTIONS = frozenset({"group_id", "stamped_headers"})

#: Options of a chain that sending it uses itself instead of passing them to its first task.
RUN_OPTIONS = frozenset({"chord", "group_id", "group_index", "link", "link_error", "parent_id", "root_id",
                         "task_id"})

#: What the kwargs of each kind of signature hold, for error messages.
_LAYOUTS = {"chain": "'tasks', a list of signatures", "group": "'tasks', a list of signatures",
            "chord": "'header', a list of signatures, and 'body', a signature"}

#: The signature class of each ``subtask_type`` (filled by :func:`register_type`).
_TYPES: dict[str, type[Signature]] = {}

S = TypeVar("S", bound="Signature")


def _name_of(task: Any) -> str:
    name = getattr(task, "name", task)
    if not isinstance(name, str) or not name:
        raise CanvasError(
            f"a signature needs a task: a task object or its name as a non-empty string (got {task!r} "
            f"that is a {type(task).__name__}); for example add.s(2, 2) or app.signature('proj.add', (2, 2))"
        )
    return name


class Signature(dict[str, Any]):
    """The arguments and options of one task call, to send now or later, or to pass around as a
    callback: ``add.s(2, 2)``, ``add.si(2, 2)``, ``app.signature("proj.add", (2, 2))``.

    Keys (Celery's): ``task`` (the name), ``args``, ``kwargs``, ``options`` (what
    ``apply_async`` takes: ``task_id``, ``queue``, ``countdown``, ``link``, ...), ``subtask_type``
    (None for one task; ``chain``, ``group``, ``chord`` for the kinds built of others) and
    ``immutable`` (arguments given when it is applied are not added: ``.si()``).
    """

    #: The app this signature sends with (None: given later, for example by the worker).
    _app: CanvasApp | None = None
    #: The task object when the signature was made from one.
    _type: CanvasTask | None = None

    def __init__(
        self,
        task: str | CanvasTask | Mapping[str, Any] | None = None,
        args: Iterable[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        options: Mapping[str, Any] | None = None,
        *,
        subtask_type: str | None = None,
        immutable: bool = False,
        app: CanvasApp | None = None,
        **extra_options: Any,
    ) -> None:
        self._app = app
        if isinstance(task, Mapping):  # a dict from a message, or another signature
            super().__init__(task)
            return
        name = _name_of(task)
        if not isinstance(task, str):
            self._type = task
        if kwargs is not None and not isinstance(kwargs, Mapping):
            raise CanvasError(f"the kwargs of a signature of {name!r} must be a mapping (got {kwargs!r})")
        super().__init__(
            task=name, args=tuple(args or ()), kwargs=kwargs if kwargs is not None else {},
            options=dict(options or {}, **extra_options), subtask_type=subtask_type, immutable=immutable,
        )

    @classmethod
    def _from_dict(cls, data: Mapping[str, Any], app: CanvasApp | None) -> Signature:
        return Signature(data, app=app)

    # -- the dict's keys as attributes --------------------------------------------------------

    @property
    def task(self) -> str:
        return str(self["task"])

    @task.setter
    def task(self, value: str) -> None:
        self["task"] = value

    name = task

    @property
    def args(self) -> Sequence[Any]:
        return self["args"]  # type: ignore[no-any-return]

    @args.setter
    def args(self, value: Sequence[Any]) -> None:
        self["args"] = value

    @property
    def kwargs(self) -> dict[str, Any]:
        return self["kwargs"]  # type: ignore[no-any-return]

    @kwargs.setter
    def kwargs(self, value: dict[str, Any]) -> None:
        self["kwargs"] = value

    @property
    def options(self) -> dict[str, Any]:
        return self["options"]  # type: ignore[no-any-return]

    @options.setter
    def options(self, value: dict[str, Any]) -> None:
        self["options"] = value

    @property
    def subtask_type(self) -> str | None:
        return self.get("subtask_type")

    @subtask_type.setter
    def subtask_type(self, value: str | None) -> None:
        self["subtask_type"] = value

    @property
    def immutable(self) -> bool:
        return bool(self.get("immutable"))

    @immutable.setter
    def immutable(self, value: bool) -> None:
        self["immutable"] = value

    @property
    def id(self) -> str | None:
        """The task id given in advance (``options.task_id``; see :meth:`freeze`)."""
        return self.options.get("task_id")

    @id.setter
    def id(self, value: str | None) -> None:
        self.options["task_id"] = value

    @property
    def parent_id(self) -> str | None:
        return self.options.get("parent_id")

    @parent_id.setter
    def parent_id(self, value: str | None) -> None:
        self.options["parent_id"] = value

    @property
    def root_id(self) -> str | None:
        return self.options.get("root_id")

    @root_id.setter
    def root_id(self, value: str | None) -> None:
        self.options["root_id"] = value

    # -- app and task ----------------------------------------------------------------------------

    @property
    def app(self) -> CanvasApp:
        """The app this signature sends with (setting it makes it send with that one)."""
        if self._app is None:
            raise ConfigurationError(
                f"the signature {self!r} belongs to no app, so it cannot be sent or frozen: make it "
                f"with task.s(...) or app.signature(name, ...), or give it one with "
                f"maybe_signature(data, app=app)"
            )
        return self._app

    @app.setter
    def app(self, value: CanvasApp) -> None:
        self._app = value

    @property
    def known_app(self) -> CanvasApp | None:
        """The app this signature sends with, None while it has none (a kind built of others
        may find one among them: see :attr:`app`)."""
        return self._app

    @property
    def type(self) -> CanvasTask | None:
        """The task object, when the task is registered with the app (else it is sent by name)."""
        if self._type is None and self._app is not None:
            self._type = self._app.tasks.get(self.task)
        return self._type

    # -- building new signatures ---------------------------------------------------------------

    def _merge(
        self, args: Iterable[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
        options: Mapping[str, Any] | None = None, force: bool = False,
    ) -> tuple[Sequence[Any], dict[str, Any], dict[str, Any]]:
        """Arguments and options as applying with these would give: ``args`` before this
        signature's own (unless immutable and not ``force``), ``kwargs`` and ``options`` over
        its own, except the options of :data:`IMMUTABLE_OPTIONS` it already has."""
        args = tuple(args or ())
        if options is not None:
            fixed = IMMUTABLE_OPTIONS.union(self.options.get("stamped_headers") or ())
            merged = {**self.options,
                      **{key: value for key, value in options.items()
                         if key not in fixed or key not in self.options}}
        else:
            merged = self.options
        if self.immutable and not force:
            return self.args, self.kwargs, merged
        return (args + tuple(self.args) if args else self.args,
                dict(self.kwargs, **kwargs) if kwargs else self.kwargs, merged)

    def clone(self, args: Iterable[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
              **options: Any) -> Signature:
        """A copy, with partial ``args`` put before its own, ``kwargs`` and ``options`` merged in
        (as :meth:`_merge` does). The options are copied deeply (links and ids of the copy are its
        own); signatures held in ``kwargs`` are cloned by the kinds that hold them."""
        if args or kwargs or options:
            new_args, new_kwargs, new_options = self._merge(args, kwargs, options)
        else:
            new_args, new_kwargs, new_options = self.args, self.kwargs, self.options
        if new_kwargs is self.kwargs:
            new_kwargs = dict(new_kwargs)
        clone = from_dict({"task": self.task, "args": tuple(new_args), "kwargs": new_kwargs,
                           "options": copy.deepcopy(new_options), "subtask_type": self.subtask_type,
                           "immutable": self.immutable}, app=self._app)
        clone._type = self._type
        return clone

    partial = clone

    def replace(self, args: Sequence[Any] | None = None, kwargs: dict[str, Any] | None = None,
                options: dict[str, Any] | None = None) -> Signature:
        """A copy with ``args``, ``kwargs`` or ``options`` replaced (those given)."""
        clone = self.clone()
        if args is not None:
            clone.args = args
        if kwargs is not None:
            clone.kwargs = kwargs
        if options is not None:
            clone.options = options
        return clone

    def set(self, immutable: bool | None = None, **options: Any) -> Signature:
        """Set options (``queue``, ``countdown``, ``priority``, ...) in place; returns itself."""
        if immutable is not None:
            self.set_immutable(immutable)
        self.options.update(options)
        return self

    def set_immutable(self, immutable: bool) -> None:
        self.immutable = immutable

    def freeze(self, _id: str | None = None, group_id: str | None = None, chord: Signature | None = None,
               root_id: str | None = None, parent_id: str | None = None,
               group_index: int | None = None) -> Any:
        """Give the task its id now (``options.task_id``; ``_id`` or a new one unless it has one)
        and its place in a workflow, and return the handle of its result (a group's: its
        GroupResult). Send a frozen signature once: sending it twice sends two messages with the
        same id."""
        opts = self.options
        task_id = opts.get("task_id")
        if not task_id:
            task_id = opts["task_id"] = _id or new_id()
        if root_id:
            opts["root_id"] = root_id
        if parent_id:
            opts["parent_id"] = parent_id
        if "reply_to" not in opts:
            opts["reply_to"] = self.app.thread_oid
        if group_id and "group_id" not in opts:
            opts["group_id"] = group_id
        if chord:
            opts["chord"] = chord
        if group_index is not None:
            opts["group_index"] = group_index
        return self.app.AsyncResult(task_id)

    # -- callbacks ---------------------------------------------------------------------------------

    def _list_option(self, key: str) -> MutableSequence[Any]:
        items: Any = self.options.setdefault(key, [])
        if not isinstance(items, MutableSequence):
            items = self.options[key] = [items]
        listed: MutableSequence[Any] = items
        return listed

    def append_to_list_option(self, key: str, value: Any) -> Any:
        items = self._list_option(key)
        if value not in items:
            items.append(value)
        return value

    def extend_list_option(self, key: str, value: Any) -> None:
        self._list_option(key).extend(as_list(value) or ())

    def link(self, callback: Signature) -> Signature:
        """Send ``callback`` with this task's return value once it succeeds; returns ``callback``."""
        return self.append_to_list_option("link", callback)  # type: ignore[no-any-return]

    def link_error(self, errback: Signature) -> Signature:
        """Send ``errback`` with this task's id if it fails; returns ``errback``."""
        return self.append_to_list_option("link_error", errback)  # type: ignore[no-any-return]

    def on_error(self, errback: Signature) -> Signature:
        """:meth:`link_error` that returns this signature, for chaining calls."""
        self.link_error(errback)
        return self

    def flatten_links(self) -> list[Signature]:
        """This signature and, recursively, those it links to."""
        found: list[Signature] = [self]
        for link in as_list(self.options.get("link")) or ():
            found.extend(maybe_signature(link, app=self._app).flatten_links())
        return found

    # -- sending -------------------------------------------------------------------------------------

    def apply_async(self, args: Iterable[Any] | None = None, kwargs: Mapping[str, Any] | None = None,
                    **options: Any) -> Any:
        """Send the task: ``args`` go before the signature's own (unless immutable), ``kwargs``
        and ``options`` over its own; options given as None are left out."""
        given = {key: value for key, value in options.items() if value is not None}
        if args or kwargs or given:
            send_args, send_kwargs, send_options = self._merge(args, kwargs, given)
        else:
            send_args, send_kwargs, send_options = self.args, self.kwargs, self.options
        # shown with dicts as built, as Celery's saferepr shows them (a copy: these are a
        # signature's own options when nothing was merged)
        send_options = {"argsrepr": safe_repr_as_built(send_args),
                        "kwargsrepr": safe_repr_as_built(send_kwargs), **send_options}
        task = self.type
        if task is not None:
            return task.apply_async(send_args, send_kwargs, **send_options)
        return self.app.send_task(self.task, send_args, send_kwargs, **send_options)

    def delay(self, *args: Any, **kwargs: Any) -> Any:
        """``apply_async(args, kwargs)``."""
        return self.apply_async(args, kwargs)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the task here and now (it must be registered with the app)."""
        merged_args, merged_kwargs, _ = self._merge(args, kwargs, None)
        task = self.type
        if task is None:
            raise CanvasError(
                f"cannot call {self.task!r} here: it is not a task of this app; send it with "
                f".delay() or .apply_async() instead")
        return task(*merged_args, **merged_kwargs)

    # -- composition -------------------------------------------------------------------------------

    def __or__(self, other: Any) -> Any:
        """``a | b``: a chain (a group on the left makes a chord), by the rules of
        :meth:`chain.compose <worker_core.canvas.chains.chain.compose>` (found through the kind
        ``chain``: the kinds build on this class)."""
        return kind("chain").compose(self, other)

    __ior__ = __or__  # ``|=`` composes too, rather than merging dicts

    # -- what the kinds built of others ask of any signature they hold -------------------------

    def chord_size(self) -> int:
        """How many results of this signature a chord it is part of waits for: one for a task
        (a group: its tasks'; a chain: its last non-empty step's; a chord: its body's)."""
        return 1

    def runs_nothing(self) -> bool:
        """Whether sending this would run no task at all (an empty chain): a group drops it."""
        return False

    def led_by_task(self) -> bool:
        """A chain whose first step is not a group (a chord body of that shape is unrolled: a
        group would run the rest once per member)."""
        return False

    def unroll_chords(self) -> None:
        """Split the chords of a chain whose body is a chain led by a task (nothing for others)."""

    def clear_chord_option(self) -> None:
        """Take off the ``chord`` option, here and where it applies within (a group's tasks, a
        chain's last step, a chord's body)."""
        self.options.pop("chord", None)

    def strip_chord_header_links(self) -> None:
        """Take the body off the header tasks of the chords within (a copy being sent): a chord
        carries its body already and puts it back on its header tasks when it sends them."""

    def members(self) -> list[Any]:
        """The signatures a chord made of this one has for its header: this one alone (a group
        or a chain: its tasks)."""
        return [self]

    # -- dict behaviour ------------------------------------------------------------------------------

    def reprcall(self, *args: Any, **kwargs: Any) -> str:
        """``name(args, kwargs)``, with ``args``/``kwargs`` merged in for the display only."""
        merged_args, merged_kwargs, _ = self._merge(args, kwargs, {}, force=True)
        shown = [repr(arg) for arg in merged_args]
        shown += [f"{key}={value!r}" for key, value in merged_kwargs.items()]
        return f"{self.task}({', '.join(shown)})"

    def __repr__(self) -> str:
        return self.reprcall()

    def __deepcopy__(self, memo: dict[int, Any]) -> dict[str, Any]:
        # As Celery's: a plain dict whose options are copied (the links and ids a clone changes);
        # arguments are shared, they may hold things that must not be copied.
        clone = dict(self)
        memo[id(self)] = clone
        clone["options"] = copy.deepcopy(self.options, memo)
        return clone

    def __reduce__(self) -> Any:
        # pickled as its dict; the app and task object are found again where it is used
        return signature, (dict(self),)

    def __json__(self) -> dict[str, Any]:
        return dict(self)


# -- the kinds, and signatures rebuilt from the dicts a message carries --------------------------


def register_type(name: str) -> Callable[[type[S]], type[S]]:
    """Class decorator: dicts whose ``subtask_type`` is ``name`` are rebuilt as this class, and
    :func:`kind` finds it by that name."""
    def register(cls: type[S]) -> type[S]:
        _TYPES[name] = cls
        return cls

    return register


def kind(name: str) -> Any:
    """The class of the kind of signature ``name`` (``chain``, ``group``, ``chord``, ...), for
    what needs a kind defined after it: a task piped into another makes a chain, and the kinds
    build on this module, so they are found by name, as :func:`from_dict` finds them."""
    return _TYPES[name]


def from_dict(data: Mapping[str, Any], app: CanvasApp | None = None) -> Signature:
    """The signature ``data`` describes, as the class its ``subtask_type`` names (a plain
    :class:`Signature` when it names none): for the dicts found in a message's embed.

    :raise CanvasError: ``data`` is not a signature's dict (no task name, an unknown kind).
    """
    if not isinstance(data, Mapping):
        raise CanvasError(f"a signature must be a mapping with a 'task' key (got {data!r} that is a "
                          f"{type(data).__name__})")
    name = data.get("subtask_type")
    if name:
        cls = _TYPES.get(name)
        if cls is None:
            raise CanvasError(f"unknown signature kind subtask_type={name!r} in {dict(data)!r}; the known "
                              f"kinds are {', '.join(sorted(_TYPES))}")
        try:
            return cls._from_dict(data, app)
        except (KeyError, TypeError, AttributeError) as exc:
            raise CanvasError(f"a signature of kind {name!r} needs Celery's layout of one (its kwargs: "
                              f"{_LAYOUTS.get(name, 'its members')}); got {dict(data)!r} ({exc!r})") from None
    if not isinstance(data.get("task"), str) or not data["task"]:
        raise CanvasError(f"a signature's dict needs a task name under 'task' (got {dict(data)!r})")
    for key, kind_of in (("args", (list, tuple)), ("kwargs", Mapping), ("options", Mapping)):
        if key in data and not isinstance(data[key], kind_of):
            raise CanvasError(f"the {key!r} of the signature of {data['task']!r} must be a "
                              f"{'list' if key == 'args' else 'mapping'} (got {data[key]!r})")
    return Signature(data, app=app)


def maybe_signature(data: Any, app: CanvasApp | None = None, clone: bool = False) -> Any:
    """``data`` as a signature: None stays None, a signature stays itself (or a clone), a dict is
    rebuilt with :func:`from_dict`; with ``app``, the signature sends with that app."""
    if data is None:
        return None
    if isinstance(data, Signature):
        if clone:
            data = data.clone()
    else:
        data = from_dict(data)
    if app is not None:
        data.app = app
    return data


def signature(varies: Any, *args: Any, **kwargs: Any) -> Signature:
    """A new signature: a clone of a signature, one rebuilt from a dict, or made from a task (or
    task name) and ``args``, ``kwargs``, ``options``."""
    if isinstance(varies, Signature):
        return varies.clone()
    if isinstance(varies, Mapping):
        return from_dict(varies, app=kwargs.get("app"))
    return Signature(varies, *args, **kwargs)


def new_id() -> str:
    """A new task (or group) id."""
    return str(uuid.uuid4())


def as_list(value: Any) -> list[Any] | None:
    """None stays None, a list or tuple is itself, anything else a list of one (Celery's maybe_list)."""
    if value is None or isinstance(value, list):
        return value
    if isinstance(value, tuple):
        return list(value)
    return [value]
