"""The messages this client publishes for a canvas are Celery's: each canvas is sent by this
project's client and by a real Celery client to the same Redis queue, and the two clients'
messages (headers, properties, content type, decoded body) must be equal once ids and times are
replaced by placeholders (``wire.normalized``). What a chord records in the result backend
before its header is sent is compared the same way. The worker-side helpers are checked against
what Celery's worker sends for the next step of a chain and for callbacks."""

from __future__ import annotations

import types

import celery
import pytest
from apps import basic, celery_basic
from conftest import empty_redis, redis_db
from wire import messages_on, normalized

from worker_core import canvas

WIRE_URL = redis_db(6)  # this file's database of the suite's Redis (emptied by each test)
QUEUE = "wire"


@pytest.fixture
def url():
    url = empty_redis(WIRE_URL)
    basic.app.conf.update(broker_url=url, result_backend=url, task_default_queue=QUEUE)
    yield url
    basic.app.conf.update(broker_url=None, result_backend=None, task_default_queue="celery")
    basic.app.close()


@pytest.fixture
def redis_client(url):
    import redis

    client = redis.Redis.from_url(url)
    yield client
    client.close()


@pytest.fixture
def theirs(url):
    app = celery_basic.client_app(broker_url=url, result_backend=url, task_default_queue=QUEUE)
    yield types.SimpleNamespace(app=app, chain=celery.chain, group=celery.group, chord=celery.chord,
                                signature=app.signature, **_tasks(app.tasks))
    app.close()


@pytest.fixture
def ours(url):
    return types.SimpleNamespace(app=basic.app, chain=canvas.chain, group=canvas.group, chord=canvas.chord,
                                 signature=basic.app.signature, **_tasks(basic.app.tasks))


def _tasks(tasks):
    return {name: tasks[f"apps.basic.{name}"] for name in ("add", "mul", "tsum", "echo", "note_failure")}


def _sent(redis_client, send, lib):
    """The messages ``send(lib)`` published, and the chord state it recorded (keys and values,
    without the key of the saved header, compared apart), leaving the database empty."""
    send(lib)
    messages = messages_on(redis_client, QUEUE)
    chord_state = {key.decode(): redis_client.get(key).decode()
                   for key in redis_client.keys("celery-taskset-meta-*")}
    redis_client.flushdb()
    return messages, chord_state


CANVASES = {
    "link and link_error": lambda t: t.add.apply_async((1, 1), link=t.mul.s(2), link_error=t.echo.s()),
    "links as lists": lambda t: t.add.apply_async((1, 1), link=[t.mul.s(2), t.echo.si(1)],
                                                  link_error=[t.echo.s()]),
    "signature with a link": lambda t: t.add.s(1, 1).on_error(t.echo.s()).delay(),
    "chain": lambda t: t.chain(t.add.s(2, 2), t.add.s(4), t.mul.s(3)).apply_async(),
    "chain of one": lambda t: t.chain(t.add.s(2, 2)).apply_async(),
    "chain with args and options": lambda t: (t.add.s(2) | t.mul.s(3)).apply_async((1,), countdown=5,
                                                                                    priority=4),
    "immutable chain": lambda t: (t.add.si(1, 1) | t.add.si(2, 2) | t.add.si(3, 3)).delay(),
    "chain with links": lambda t: (t.add.s(1, 1) | t.mul.s(2)).apply_async(link=t.echo.s(),
                                                                            link_error=t.echo.si("failed")),
    "group": lambda t: t.group(t.add.s(i, i) for i in range(3)).apply_async(),
    "group with args": lambda t: t.group(t.add.s(1), t.mul.s(2)).apply_async((10,), priority=5),
    "nested group": lambda t: t.group(t.add.s(1, 1), t.group(t.add.s(2, 2), t.add.s(3, 3))).apply_async(),
    "group of chains": lambda t: t.group(t.add.s(1, 1) | t.mul.s(2), t.add.s(2, 2) | t.mul.s(3)).delay(),
    "chord": lambda t: t.chord([t.add.s(i, i) for i in range(3)], t.tsum.s()).apply_async(),
    "chord called with its body": lambda t: t.chord([t.add.s(1, 1), t.add.s(2, 2)])(t.tsum.s()),
    "group | task": lambda t: (t.group(t.add.s(1, 1), t.add.s(2, 2)) | t.tsum.s()).delay(),
    "chord with a chain in its header": lambda t: t.chord(
        [t.add.s(1, 1) | t.mul.s(2), t.add.s(2, 2)], t.tsum.s()).apply_async(),
    "chord with a group in its header": lambda t: t.chord(
        [t.add.s(1, 1), t.group(t.add.s(2, 2), t.add.s(3, 3))], t.tsum.s()).apply_async(),
    "chord with a chain body": lambda t: t.chord([t.add.s(1, 1), t.add.s(2, 2)],
                                                 t.tsum.s() | t.mul.s(10)).apply_async(),
    "chord with links": lambda t: t.chord([t.add.s(1, 1)], t.tsum.s()).apply_async(
        link=t.echo.s(), link_error=t.echo.si("failed")),
    "chain through a chord": lambda t: (t.add.s(1, 1) | t.group(t.mul.s(2), t.mul.s(3)) | t.tsum.s()
                                        | t.mul.s(10)).delay(),
    "chain ending in a group": lambda t: (t.add.s(1, 1) | t.group(t.mul.s(2), t.mul.s(3))).delay(),
    "map": lambda t: t.tsum.map([[1, 2], [3, 4]]).delay(),
    "starmap": lambda t: t.add.starmap([(1, 2), (3, 4)]).apply_async(countdown=1),
    "chunks": lambda t: t.add.chunks([(i, i) for i in range(5)], 2).apply_async(),
    # (ignore_result given: Celery's send_task leaves the header null unless told, this one
    # writes the ignore_result setting's value, as for plain tasks)
    "send_task with canvas options and headers": lambda t: t.app.send_task(
        "apps.basic.add", (1, 2), link=t.mul.s(2), chain=[t.echo.s()], group_id="3f0c2d7e-4e8e-4b8e-9d6f-"
        "0a2b3c4d5e6f", group_index=2, shadow="adding", headers={"tenant": "acme"}, ignore_result=False),
}


@pytest.mark.redis
@pytest.mark.filterwarnings("ignore::celery.exceptions.CPendingDeprecationWarning")
@pytest.mark.parametrize("name", sorted(CANVASES))
def test_a_canvas_is_published_as_celerys_client_publishes_it(name, redis_client, ours, theirs):
    ours_messages, ours_state = _sent(redis_client, CANVASES[name], ours)
    theirs_messages, theirs_state = _sent(redis_client, CANVASES[name], theirs)
    assert ours_messages, "nothing was published"
    assert normalized(ours_messages) == normalized(theirs_messages)
    assert normalized(ours_state) == normalized(theirs_state)


@pytest.mark.redis
def test_a_plain_task_is_published_as_before_canvas_with_an_empty_embed(redis_client, ours, theirs):
    [ours_message], _ = _sent(redis_client, lambda t: t.add.delay(1, 2), ours)
    [theirs_message], _ = _sent(redis_client, lambda t: t.add.delay(1, 2), theirs)
    assert ours_message["body"] == [[1, 2], {}, {"callbacks": None, "errbacks": None, "chain": None,
                                                 "chord": None}]
    # the one difference: Celery's client names itself in reply_to (read only by its RPC result
    # backend), this client leaves a plain task's empty, as it always did
    assert ours_message["properties"]["reply_to"] == ""
    ours_message["properties"]["reply_to"] = theirs_message["properties"]["reply_to"]
    assert normalized(ours_message) == normalized(theirs_message)


@pytest.mark.redis
def test_the_chord_size_is_recorded_before_the_last_header_task_is_sent(redis_client, ours):
    seen = []

    def before_task_publish(headers, **_):
        keys = sorted(key.decode() for key in redis_client.keys("celery-taskset-meta-*.s"))
        seen.append((headers["group_index"], keys))

    hooks = types.SimpleNamespace(before_task_publish=canvas_hook(before_task_publish))
    name = basic.app.register_hooks(hooks, name="wire-test")
    try:
        result = ours.chord([ours.add.s(i, i) for i in range(3)], ours.tsum.s()).apply_async()
    finally:
        basic.app.unregister_hooks(name)
    group_id = result.parent.id
    assert seen == [(0, []), (1, []), (2, [f"celery-taskset-meta-{group_id}.s"])]
    assert redis_client.get(f"celery-taskset-meta-{group_id}.s") == b"3"
    assert 0 < redis_client.ttl(f"celery-taskset-meta-{group_id}.s") <= 86400


def canvas_hook(function):
    from worker_core import hookimpl

    return hookimpl(function)


# -- the worker side: what a finished task's embed makes a worker send ---------------------------


def _celery_message(redis_client, theirs, build):
    build(theirs)
    [first, *_] = messages_on(redis_client, QUEUE)
    redis_client.flushdb()
    return first


@pytest.mark.redis
def test_the_next_step_of_a_chain_is_sent_as_celerys_worker_sends_it(redis_client, ours, theirs):
    first = _celery_message(redis_client, theirs,
                            lambda t: (t.add.s(1, 1) | t.mul.s(2) | t.add.s(3)).apply_async())
    headers, (_, _, embed) = first["headers"], first["body"]
    parent_id, root_id = headers["id"], headers["root_id"]

    step = canvas.Embed.parse(embed, basic.app)
    assert [sig.task for sig in step.remaining] == ["apps.basic.mul", "apps.basic.add"]
    sent = canvas.send_next_step(basic.app, step, 2, parent_id=parent_id, root_id=root_id)
    assert sent.id == embed["chain"][-1]["options"]["task_id"]
    ours_messages = messages_on(redis_client, QUEUE)
    redis_client.flushdb()
    # what celery/app/trace.py does with the same embed
    chain = embed["chain"]
    celery.signature(chain[-1], app=theirs.app).apply_async((2,), chain=chain[:-1], parent_id=parent_id,
                                                            root_id=root_id)
    theirs_messages = messages_on(redis_client, QUEUE)
    assert normalized(ours_messages) == normalized(theirs_messages)
    assert ours_messages[0]["headers"]["parent_id"] == parent_id
    assert ours_messages[0]["headers"]["root_id"] == root_id


@pytest.mark.redis
def test_callbacks_and_errbacks_are_sent_as_celerys_worker_sends_them(redis_client, ours, theirs):
    first = _celery_message(redis_client, theirs, lambda t: t.add.apply_async(
        (1, 1), link=[t.mul.s(2), t.group(t.echo.s(), t.echo.s())], link_error=[t.echo.s(), t.echo.si(0)]))
    headers, (_, _, embed) = first["headers"], first["body"]
    step = canvas.Embed.parse(embed, basic.app)
    assert isinstance(step.callbacks[1], canvas.group)

    canvas.send_callbacks(basic.app, step.callbacks, 2, parent_id=headers["id"], root_id=headers["root_id"])
    canvas.send_errbacks(basic.app, step.errbacks, headers["id"], root_id=headers["root_id"])
    ours_messages = messages_on(redis_client, QUEUE)
    redis_client.flushdb()

    callbacks = [celery.signature(sig, app=theirs.app) for sig in embed["callbacks"]]
    callbacks[1].apply_async((2,), parent_id=headers["id"], root_id=headers["root_id"])
    celery.group([callbacks[0]], app=theirs.app).apply_async((2,), parent_id=headers["id"],
                                                             root_id=headers["root_id"])
    errbacks = [celery.signature(sig, app=theirs.app) for sig in embed["errbacks"]]
    celery.group(errbacks, app=theirs.app).apply_async((headers["id"],), parent_id=headers["id"],
                                                        root_id=headers["root_id"])
    theirs_messages = messages_on(redis_client, QUEUE)
    assert normalized(ours_messages) == normalized(theirs_messages)


@pytest.mark.redis
def test_a_chord_header_task_knows_its_body(redis_client, ours, theirs):
    first = _celery_message(redis_client, theirs, lambda t: t.chord(
        [t.add.s(1, 1), t.add.s(2, 2)], t.tsum.s() | t.mul.s(2)).delay())
    step = canvas.Embed.parse(first["body"][2], basic.app)
    body = step.chord_body
    assert isinstance(body, canvas.chain) and [sig.task for sig in body.tasks] == ["apps.basic.tsum",
                                                                                  "apps.basic.mul"]
    # the body's last task is the chord's result, a member of the header's group
    assert body.tasks[-1].options["group_id"] == first["headers"]["group"]
    assert body.id == body.tasks[-1].id


@pytest.mark.parametrize("embed, fragment", [
    ("nope", "embed must be a mapping"),
    ({"callbacks": {"task": "x"}}, "'callbacks' must be a list"),
    ({"chain": [{"args": []}]}, "'chain' holds a malformed signature"),
    ({"chord": 5}, "'chord' holds a malformed signature"),
])
def test_a_malformed_embed_is_refused_naming_what_is_wrong(embed, fragment):
    from worker_core.exceptions import CanvasError

    with pytest.raises(CanvasError, match=fragment):
        canvas.Embed.parse(embed, basic.app)


def test_a_plain_task_message_carries_an_empty_embed():
    from worker_core.protocol import task_message

    message = task_message("proj.add", "id-1", (1, 2))
    assert message.body[2] == {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
    assert canvas.Embed.parse(message.body[2], basic.app) == canvas.Embed()
