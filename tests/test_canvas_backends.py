"""What canvas asks of the result backend: group results saved and restored on the embedded
backend, and a clear refusal, before anything is sent, of what a backend cannot do."""

from __future__ import annotations

import types

import pytest
from apps import basic

from worker_core import App, GroupResult, canvas, hookimpl
from worker_core.exceptions import ConfigurationError


@pytest.fixture
def published(embedded_broker):
    """The names of the tasks ``basic.app`` publishes during the test (embedded broker, whose
    own result backend keeps results and groups)."""
    sent: list[str] = []
    name = basic.app.register_hooks(
        types.SimpleNamespace(after_task_publish=hookimpl(lambda name: sent.append(name))), name="published")
    yield sent
    basic.app.unregister_hooks(name)


def test_a_chord_without_a_result_backend_is_refused_before_anything_is_sent(published):
    basic.app.conf.update(result_backend="disabled://")
    try:
        chord = canvas.chord([basic.add.s(1, 1), basic.add.s(2, 2)], basic.tsum.s())
        with pytest.raises(ConfigurationError, match=r"a chord needs a result backend that keeps the "
                                                     r"header's results, and the result backend "
                                                     r"worker_core.results.disabled.DisabledBackend "
                                                     r"\(disabled://\) keeps none: configure one"):
            chord.delay()
        with pytest.raises(ConfigurationError, match="a chord needs"):
            (canvas.group(basic.add.s(1, 1), basic.add.s(2, 2)) | basic.tsum.s() | basic.mul.s(2)).delay()
    finally:
        basic.app.conf.update(result_backend=None)
    assert published == []


def test_a_chord_on_the_embedded_backend_is_counted_there(published):
    """The embedded backend joins chords itself: the client records the chord's size there and
    sends only the header (no celery.chord_unlock)."""
    result = canvas.chord([basic.add.s(1, 1), basic.add.s(2, 2)], basic.tsum.s()).delay()
    assert published == ["apps.basic.add", "apps.basic.add"]
    assert result.parent is not None and len(result.parent.results) == 2


def test_groups_chains_and_links_need_no_more_than_a_backend(published):
    (basic.add.s(1, 1) | basic.mul.s(2)).delay()
    canvas.group(basic.add.s(1, 1), basic.add.s(2, 2)).delay()
    basic.add.apply_async((1, 1), link=basic.mul.s(2))
    assert published == ["apps.basic.add", "apps.basic.add", "apps.basic.add", "apps.basic.add"]


def test_a_group_result_is_saved_restored_and_deleted_on_the_embedded_backend(embedded_broker):
    result = canvas.group(basic.add.s(1, 1), basic.add.s(2, 2)).freeze()
    parent = basic.app.AsyncResult("before-the-group")
    saved = basic.app.GroupResult(result.id, [*result.results, basic.app.GroupResult("inner", [
        basic.app.AsyncResult("inner-task")])], parent=parent).save()
    restored = GroupResult.restore(saved.id, app=basic.app)
    assert restored == saved and restored is not saved
    assert restored.parent.id == "before-the-group"
    assert [type(r).__name__ for r in restored] == ["AsyncResult", "AsyncResult", "GroupResult"]
    assert restored[2].results[0].id == "inner-task"
    assert restored.as_tuple() == saved.as_tuple()
    saved.delete()
    assert basic.app.GroupResult.restore(saved.id) is None


def test_saving_a_group_without_a_result_backend_says_what_to_configure():
    app = App("no-results", broker="amqp://guest:guest@127.0.0.1:5672//")  # nothing connects
    with pytest.raises(ConfigurationError, match=r"result backend .*DisabledBackend \(disabled.*\).*"
                                                 r"embedded or the Redis result backend"):
        app.GroupResult("g1", [app.AsyncResult("t1")]).save()
    with pytest.raises(ConfigurationError, match="keeps groups"):
        app.GroupResult.restore("g1")


def test_send_task_refuses_an_option_it_cannot_honour_saying_so():
    app = App("options", broker="amqp://guest:guest@127.0.0.1:5672//")
    with pytest.raises(TypeError, match=r"send_task\('proj.add'\) got the option 'mandatory', which this "
                                        r"client does not take"):
        app.send_task("proj.add", (1,), mandatory=True)
    with pytest.raises(TypeError, match="retry must be True or False"):
        app.send_task("proj.add", (1,), retry="yes")
