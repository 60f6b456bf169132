"""Signatures and the ``|`` rules against Celery's own: each canvas is built with both libraries
from the same tasks (``apps.basic`` and ``apps.celery_basic`` register the same names) and the
two must serialize to the same dict; frozen canvases must give every task its id in the same
places (ids compared by where they repeat, see ``wire.normalized``)."""

from __future__ import annotations

import types

import celery
import pytest
from apps import basic, celery_basic
from conftest import REDIS_TEST_URL
from wire import normalized, plain

from worker_core import canvas
from worker_core.canvas import Signature, from_dict, maybe_signature
from worker_core.exceptions import CanvasError

OURS = types.SimpleNamespace(app=basic.app, chain=canvas.chain, group=canvas.group, chord=canvas.chord,
                             signature=canvas.signature, add=basic.add, mul=basic.mul, tsum=basic.tsum,
                             echo=basic.echo)
THEIRS = types.SimpleNamespace(app=celery_basic.app, chain=celery.chain, group=celery.group,
                               chord=celery.chord, signature=celery.signature, add=celery_basic.add,
                               mul=celery_basic.mul, tsum=celery_basic.tsum, echo=celery_basic.echo)


def both(build):
    """``build(lib)`` with each library, as the JSON each would send."""
    return plain(build(OURS)), plain(build(THEIRS))


CANVASES = {
    "task": lambda t: t.add.s(2, 2),
    "immutable task": lambda t: t.add.si(2, 2),
    "options": lambda t: t.add.s(2).set(countdown=10, queue="q", priority=3),
    "signature by name": lambda t: t.signature("apps.basic.add", args=(1,), kwargs={"y": 2}, countdown=1),
    "task | task": lambda t: t.add.s(2, 2) | t.mul.s(3),
    "task | task | task": lambda t: t.add.s(2, 2) | t.mul.s(3) | t.add.s(1),
    "task | chain": lambda t: t.add.s(1, 1) | (t.mul.s(2) | t.add.s(3)),
    "chain | chain": lambda t: (t.add.s(1, 1) | t.mul.s(2)) | (t.add.s(3) | t.mul.s(4)),
    "task | group": lambda t: t.add.s(1, 1) | t.group(t.mul.s(2), t.mul.s(3)),
    "task | group of one": lambda t: t.add.s(1, 1) | t.group(t.mul.s(2)),
    "group | task": lambda t: t.group(t.add.s(1, 1), t.add.s(2, 2)) | t.tsum.s(),
    "group | empty group": lambda t: t.group(t.add.s(1, 1)) | t.group([]),
    "chain | group | task": lambda t: t.add.s(1, 1) | t.group(t.mul.s(2), t.mul.s(3)) | t.tsum.s(),
    "chain | group | task | group | task": lambda t: (
        t.add.s(1, 1) | t.group(t.mul.s(2), t.mul.s(3)) | t.tsum.s() | t.group(t.mul.s(2), t.mul.s(3))
        | t.tsum.s()),
    "chain | empty group": lambda t: (t.add.s(1, 1) | t.mul.s(2)) | t.group([]),
    "chord | task": lambda t: t.chord([t.add.s(1, 1), t.add.s(2, 2)], t.tsum.s()) | t.mul.s(2),
    "chord | chain": lambda t: t.chord([t.add.s(1, 1)], t.tsum.s()) | (t.mul.s(2) | t.add.s(1)),
    "chord | group of one": lambda t: t.chord([t.add.s(1, 1)], t.tsum.s()) | t.group(t.mul.s(2)),
    "chord | group": lambda t: t.chord([t.add.s(1, 1)], t.tsum.s()) | t.group(t.mul.s(2), t.mul.s(3)),
    "chain ending in a chord | task": lambda t: (
        t.add.s(1, 1) | t.chord([t.mul.s(2), t.mul.s(3)], t.tsum.s())) | t.add.s(5),
    "chain ending in a chord | group": lambda t: (
        t.add.s(1, 1) | t.chord([t.mul.s(2), t.mul.s(3)], t.tsum.s())) | t.group(t.mul.s(2), t.mul.s(3)),
    "chain(a, b, c)": lambda t: t.chain(t.add.s(2, 2), t.mul.s(3), t.add.s(1)),
    "chain(list)": lambda t: t.chain([t.add.s(2, 2), t.mul.s(3)]),
    "chain(generator)": lambda t: t.chain(t.add.s(i) for i in range(4)),
    "chain(group, task)": lambda t: t.chain(t.group(t.add.s(1, 1), t.add.s(2, 2)), t.tsum.s()),
    "chain(task, chain, group, task)": lambda t: t.chain(
        t.add.s(1, 1), t.chain(t.mul.s(2), t.add.s(1)), t.group(t.mul.s(2), t.mul.s(3)), t.tsum.s()),
    "chain with options": lambda t: t.chain(t.add.s(1, 1), t.mul.s(2), countdown=3),
    "group": lambda t: t.group(t.add.s(i, i) for i in range(3)),
    "group(list, options)": lambda t: t.group([t.add.s(1, 1), t.mul.s(2, 2)], queue="q"),
    "group of chains": lambda t: t.group(t.add.s(1, 1) | t.mul.s(2), t.add.s(2, 2) | t.mul.s(3)),
    "nested group": lambda t: t.group(t.add.s(1, 1), t.group(t.add.s(2, 2), t.add.s(3, 3))),
    "chord": lambda t: t.chord([t.add.s(i, i) for i in range(3)], t.tsum.s()),
    "chord of a group": lambda t: t.chord(t.group(t.add.s(1, 1), t.add.s(2, 2)), t.tsum.s()),
    "chord with a chain in its header": lambda t: t.chord([t.add.s(1, 1) | t.mul.s(2), t.add.s(2, 2)],
                                                          t.tsum.s()),
    "chord with a chain body": lambda t: t.chord([t.add.s(1, 1)], t.tsum.s() | t.mul.s(10)),
    "chord without a body": lambda t: t.chord([t.add.s(1, 1), t.add.s(2, 2)]),
    "map": lambda t: t.tsum.map([[1, 2], [3, 4]]),
    "starmap": lambda t: t.add.starmap([(1, 2), (3, 4)]),
    "chunks": lambda t: t.add.chunks([(i, i) for i in range(5)], 2),
    "chunks as a group": lambda t: t.add.chunks([(i, i) for i in range(5)], 2).group(),
    "clone with partial args": lambda t: t.add.s(2).clone((1,), {"z": 3}, countdown=4),
    "immutable clone ignores args": lambda t: t.add.si(2, 2).clone((1,), countdown=4),
    "chain clone": lambda t: (t.add.s(1, 1) | t.mul.s(2)).clone(),
    "replace": lambda t: t.add.s(1, 1).replace(args=(5, 5), options={"queue": "x"}),
    "link": lambda t: _linked(t.add.s(1, 1), t.mul.s(2)),
    "link twice the same": lambda t: _linked(_linked(t.add.s(1, 1), t.mul.s(2)), t.mul.s(2)),
    "link_error": lambda t: _errback(t.add.s(1, 1), t.echo.s()),
    "on_error": lambda t: t.add.s(1, 1).on_error(t.echo.s()),
    "chain | task keeps the chain's links": lambda t: _errback(
        _linked(t.add.s(1, 1) | t.mul.s(2), t.echo.s()), t.echo.si(0)) | t.add.s(1),
    "group.link": lambda t: _linked(t.group(t.add.s(1, 1), t.add.s(2, 2)), t.echo.s()),
    "group.link_error": lambda t: _errback(t.group(t.add.s(1, 1), t.add.s(2, 2)), t.echo.s()),
    "chord.link": lambda t: _linked(t.chord([t.add.s(1, 1)], t.tsum.s()), t.echo.s()),
    "chord.link_error": lambda t: _errback(t.chord([t.add.s(1, 1)], t.tsum.s()), t.echo.s()),
    "set_immutable on a group": lambda t: _immutable(t.group(t.add.s(1, 1), t.add.s(2, 2))),
}


def _linked(sig, callback):
    sig.link(callback)
    return sig


def _errback(sig, errback):
    sig.link_error(errback)
    return sig


def _immutable(sig):
    sig.set_immutable(True)
    return sig


@pytest.mark.filterwarnings("ignore::celery.exceptions.CPendingDeprecationWarning")
@pytest.mark.parametrize("name", sorted(CANVASES))
def test_a_canvas_is_the_same_dict_as_celerys(name):
    ours, theirs = both(CANVASES[name])
    assert ours == theirs


@pytest.mark.parametrize("name", sorted(CANVASES))
def test_a_canvas_becomes_the_same_kind_of_signature_again_from_its_dict(name):
    built = CANVASES[name](OURS)
    rebuilt = from_dict(plain(built), app=basic.app)
    assert type(rebuilt) is (Signature if built.subtask_type is None else type(built))
    assert plain(rebuilt) == plain(built)
    assert plain(rebuilt.clone()) == plain(built)


@pytest.mark.filterwarnings("ignore::celery.exceptions.CPendingDeprecationWarning")
def test_composition_gives_the_kind_celery_gives():
    for name, build in CANVASES.items():
        assert plain(build(OURS)).get("subtask_type") == plain(build(THEIRS)).get("subtask_type"), name
    assert isinstance(basic.add.s(1, 1) | basic.mul.s(2), canvas.chain)
    assert isinstance(canvas.group(basic.add.s(1, 1)) | basic.tsum.s(), canvas.chord)
    assert isinstance(canvas.chain(canvas.group(basic.add.s(1, 1), basic.add.s(2, 2)), basic.tsum.s()),
                      canvas.chord)


def test_partial_application_puts_the_previous_result_first_unless_immutable():
    sig = basic.add.s(2)
    args, kwargs, _ = sig._merge((1,), {"k": 1}, {})
    assert (tuple(args), kwargs) == ((1, 2), {"k": 1})
    args, kwargs, _ = basic.add.si(2, 3)._merge((1,), {"k": 1}, {})
    assert (tuple(args), kwargs) == ((2, 3), {})


def test_options_merge_except_group_id():
    sig = basic.add.s(1, 1).set(group_id="g1", queue="a")
    merged = sig.clone(group_id="g2", queue="b").options
    assert (merged["group_id"], merged["queue"]) == ("g1", "b")
    theirs = celery_basic.add.s(1, 1).set(group_id="g1", queue="a").clone(group_id="g2", queue="b").options
    assert merged == theirs


def test_a_clone_has_options_of_its_own():
    sig = basic.add.s(1, 1)
    sig.link(basic.mul.s(2))
    copy = sig.clone()
    copy.link(basic.echo.s())
    copy.set(queue="other")
    assert len(sig.options["link"]) == 1 and "queue" not in sig.options


FROZEN = {
    "task": lambda t: t.add.s(2, 2),
    "chain": lambda t: t.add.s(2, 2) | t.mul.s(3) | t.add.s(1),
    "group": lambda t: t.group(t.add.s(1, 1), t.add.s(2, 2), t.group(t.add.s(3, 3))),
    "chord": lambda t: t.chord([t.add.s(1, 1), t.add.s(2, 2)], t.tsum.s()),
    "chain with a chord": lambda t: t.add.s(1, 1) | t.group(t.mul.s(2), t.mul.s(3)) | t.tsum.s() | t.mul.s(2),
    "group of chains": lambda t: t.group(t.add.s(1, 1) | t.mul.s(2), t.add.s(2, 2) | t.mul.s(3)),
}


@pytest.fixture
def chord_backends():
    """Both apps with a Redis result backend (chords need one; Celery subscribes to results)."""
    basic.app.conf.update(result_backend=REDIS_TEST_URL)
    before = celery_basic.app.conf.result_backend
    celery_basic.app.conf.result_backend = REDIS_TEST_URL
    yield
    celery_basic.app.conf.result_backend = before
    basic.app.conf.update(result_backend=None)
    basic.app.close()


def _tree(result):
    """A result and its parents as ids (group results with their members)."""
    if result is None:
        return None
    members = getattr(result, "results", None)
    return {"id": result.id, "parent": _tree(result.parent),
            "results": None if members is None else [_tree(member) for member in members]}


@pytest.mark.parametrize("name", sorted(FROZEN))
def test_freezing_gives_ids_where_celery_gives_them(name, chord_backends):
    ours, theirs = FROZEN[name](OURS), FROZEN[name](THEIRS)
    ours_result, theirs_result = ours.freeze(), theirs.freeze()
    ids: dict[str, str] = {}
    their_ids: dict[str, str] = {}
    assert normalized([plain(ours), _tree(ours_result)], ids) == \
        normalized([plain(theirs), _tree(theirs_result)], their_ids)
    assert ours.id is not None


def test_a_frozen_task_keeps_its_id_and_names_this_client():
    sig = basic.add.s(1, 1)
    result = sig.freeze()
    assert result.id == sig.id == sig.options["task_id"]
    assert sig.options["reply_to"] == basic.app.thread_oid
    assert sig.freeze().id == result.id


def test_maybe_signature_binds_dicts_to_the_app_it_is_given():
    sig = maybe_signature(plain(basic.add.s(1, 1) | basic.mul.s(2)), app=basic.app)
    assert isinstance(sig, canvas.chain) and sig.app is basic.app
    assert maybe_signature(None) is None
    assert maybe_signature(sig) is sig and maybe_signature(sig, clone=True) is not sig


@pytest.mark.parametrize("data, fragment", [
    ({"args": [1]}, "needs a task name"),
    ({"task": "x", "args": 5}, "'args' of the signature of 'x' must be a list"),
    ({"task": "x", "subtask_type": "nope"}, "unknown signature kind subtask_type='nope'"),
    ([1, 2], "must be a mapping"),
])
def test_a_malformed_signature_dict_is_refused_saying_what_is_wrong(data, fragment):
    with pytest.raises(CanvasError, match=fragment):
        from_dict(data)


def test_a_signature_needs_an_app_to_be_sent_and_says_how_to_give_it_one():
    from worker_core.exceptions import ConfigurationError

    with pytest.raises(ConfigurationError, match=r"belongs to no app.*task\.s"):
        canvas.signature("proj.add", (1, 1)).delay()


def test_calling_a_signature_runs_the_task_here():
    assert basic.add.s(2)(3) == 5
    assert (basic.add.si(2, 2))(100) == 4


def test_signatures_show_as_their_call():
    assert repr(basic.add.s(2, 2)) == "apps.basic.add(2, 2)"
    assert repr(basic.add.s(2) | basic.mul.s(3)) == "apps.basic.add(2) | apps.basic.mul(3)"
