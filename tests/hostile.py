"""Hypothesis strategies for task messages: hostile ones, each with the reason the worker must give
when it rejects it, and good ones, each with the result it must produce."""

from __future__ import annotations

import json
import uuid
from collections.abc import Sequence
from datetime import datetime
from typing import Any

import attrs
from hypothesis import strategies as st

JSON = "application/json"
#: the largest body the fuzzed worker accepts (``worker_max_message_size``)
MAX_SIZE = 256 * 1024
UNDECODABLE = "body cannot be decoded as application/json"

#: JSON values: what a body or a header may hold after a JSON round trip (no NaN: NaN != NaN)
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63) | st.floats(allow_nan=False)
    | st.text(max_size=20),
    lambda children: st.lists(children, max_size=5) | st.dictionaries(st.text(max_size=10), children,
                                                                      max_size=5),
    max_leaves=15,
)


@attrs.frozen
class Message:
    """A raw message to publish, and what must come of it: a rejection naming ``reason``, or a
    task result equal to ``result`` (or the exception type ``raises``)."""

    body: bytes
    headers: Any
    content_type: str | None = JSON
    content_encoding: str | None = "utf-8"
    reason: str | None = None
    result: Any = None
    raises: type[BaseException] | None = None

    @property
    def task_id(self) -> str | None:
        if isinstance(self.headers, dict) and isinstance(self.headers.get("id"), str):
            return self.headers["id"]
        return None


def _id() -> str:
    return f"fuzz-{uuid.uuid4()}"


def v2(args: list[Any], kwargs: dict[str, Any] | None = None) -> bytes:
    embed = {"callbacks": None, "errbacks": None, "chain": None, "chord": None}
    return json.dumps([args, kwargs or {}, embed]).encode()


def headers_for(task: str, extra: dict[str, Any] | None = None) -> dict[str, Any]:
    """Celery's headers for ``task``, then ``extra`` over them."""
    return {"lang": "py", "task": task, "id": _id(), "retries": 0, "timelimit": [None, None], **(extra or {})}


# -- good messages -------------------------------------------------------------------------------


@st.composite
def good_messages(draw: st.DrawFn) -> Message:
    kind = draw(st.sampled_from(["add", "echo", "huge", "nested", "v1", "many-args"]))
    if kind == "add":
        x, y = draw(st.integers(-(10**6), 10**6)), draw(st.integers(-(10**6), 10**6))
        return Message(v2([x, y]), headers_for("apps.basic.add"), result=x + y)
    if kind == "echo":
        value = draw(json_values)
        return Message(v2([value]), headers_for("apps.basic.echo"), result=value)
    if kind == "huge":  # a huge argument list, under the size limit
        value = list(range(draw(st.integers(1_000, 30_000))))
        return Message(v2([value]), headers_for("apps.basic.echo"), result=value)
    if kind == "nested":  # nested deeply, but not too deeply to decode and pickle
        depth = draw(st.integers(10, 150))
        value: Any = 1
        for _ in range(depth):
            value = [value]
        return Message(v2([value]), headers_for("apps.basic.echo"), result=value)
    if kind == "v1":  # a version 1 body: everything in one dict, no task header
        value = draw(json_values)
        task_id = _id()
        body = json.dumps({"task": "apps.basic.echo", "id": task_id, "args": [value], "kwargs": {}}).encode()
        return Message(body, {"id": task_id}, result=value)
    # so many arguments that the function cannot take them: the task fails, the worker goes on
    count = draw(st.integers(3, 5_000))
    return Message(v2(list(range(count))), headers_for("apps.basic.add"), raises=TypeError)


# -- hostile messages ------------------------------------------------------------------------------

not_text = st.one_of(st.integers(), st.floats(), st.booleans(), st.lists(st.integers(), max_size=3),
                     st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
#: not a whole number 0 or more (a float is wrong even when it is 2.0: JSON keeps it a float)
not_whole = st.one_of(st.integers(max_value=-1), st.floats(), st.text(max_size=5), st.booleans(),
                      st.lists(st.integers(), max_size=2))


def _not_iso(text: str) -> bool:
    candidate = text[:-1] + "+00:00" if text.endswith(("Z", "z")) else text
    try:
        datetime.fromisoformat(candidate)
    except ValueError:
        return True
    return False


#: (header, wrong values, the reason's words)
WRONG_HEADERS: list[tuple[str, st.SearchStrategy[Any], str]] = [
    ("task", not_text, "header 'task' must be a string"),
    ("task", st.just(""), "header 'task' must not be empty"),
    ("id", not_text, "header 'id' must be a string"),
    ("retries", not_whole, "header 'retries' must be a whole number"),
    ("group_index", not_whole, "header 'group_index' must be a whole number"),
    ("eta", not_text, "header 'eta' must be an ISO 8601 date-time"),
    ("eta", st.text(max_size=30).filter(_not_iso), "header 'eta' is not an ISO 8601 date-time"),
    ("expires", not_text, "header 'expires' must be an ISO 8601 date-time"),
    ("timelimit", st.one_of(st.integers(), st.text(max_size=5),
                            st.lists(st.integers(min_value=0), min_size=3),
                            st.tuples(st.integers(max_value=-1), st.none()),
                            st.tuples(st.text(max_size=3), st.none())),
     "header 'timelimit' must be [hard, soft]"),
    ("ignore_result", st.one_of(st.integers(), st.text(max_size=5), st.lists(st.booleans(), max_size=2)),
     "header 'ignore_result' must be true or false"),
    *((name, not_text, f"header {name!r} must be a string")
      for name in ("root_id", "parent_id", "group", "origin", "shadow")),
]


@st.composite
def wrong_header(draw: st.DrawFn) -> Message:
    name, values, reason = draw(st.sampled_from(WRONG_HEADERS))
    return Message(v2([1, 2]), headers_for("apps.basic.add", {name: draw(values)}), reason=reason)


@st.composite
def truncated_body(draw: st.DrawFn) -> Message:
    body = v2([draw(json_values), draw(json_values)])
    cut = draw(st.integers(1, len(body) - 1))
    return Message(body[:cut], headers_for("apps.basic.add"), reason=UNDECODABLE)


@st.composite
def oversized_body(draw: st.DrawFn) -> Message:
    size = draw(st.integers(MAX_SIZE + 1, 2 * MAX_SIZE))
    body = v2(["x" * size])
    return Message(body, headers_for("apps.basic.echo"), reason="more than worker_max_message_size")


@st.composite
def bad_encoding(draw: st.DrawFn) -> Message:
    if draw(st.booleans()):  # not UTF-8 although it says so
        junk = draw(st.sampled_from([b"\xff", b"\xfe\xff", b"\xc3\x28", b"\xa0\xa1", b"\xed\xa0\x80"]))
        return Message(b'[["' + junk + b'"], {}, {}]', headers_for("apps.basic.echo"),
                       reason="body cannot be decoded as application/json: UnicodeDecodeError")
    encoding = draw(st.sampled_from(["nope-8", "utf-99", "base64", "rot13", "klingon"]))
    return Message(v2([1]), headers_for("apps.basic.echo"), content_encoding=encoding,
                   reason="body cannot be decoded as application/json: LookupError")


@st.composite
def unknown_content_type(draw: st.DrawFn) -> Message:
    content_type = draw(st.sampled_from(["application/x-python-serialize", "application/x-yaml",
                                         "text/plain", "application/xml", "application/x-msgpack",
                                         "image/png"]))
    return Message(v2([1]), headers_for("apps.basic.echo"), content_type=content_type,
                   reason=f"content type {content_type!r} is not accepted")


@st.composite
def too_deep(draw: st.DrawFn) -> Message:
    depth = draw(st.integers(3_000, 50_000))
    body = ("[[" + "[" * depth + "1" + "]" * depth + "], {}, {}]").encode()
    return Message(body, headers_for("apps.basic.echo"), reason="nested too deeply")


@st.composite
def wrong_shape(draw: st.DrawFn) -> Message:
    shape, reason = draw(st.sampled_from([  # (a factory, so each draw gets a fresh body)
        (lambda: [1, 2], "body args must be a list"),
        (lambda: ["x", {}, {}], "body args must be a list"),
        (lambda: [[1], [], {}], "body kwargs must be an object"),
        (lambda: [[1], {}, 5], "body embed must be an object or null"),
        (lambda: [[1]], "body must be [args, kwargs, embed]"),
        (lambda: [[1], {}, {}, {}], "body must be [args, kwargs, embed]"),
        (lambda: "text", "body must be [args, kwargs, embed]"),
    ]))
    return Message(json.dumps(shape()).encode(), headers_for("apps.basic.echo"), reason=reason)


@st.composite
def bad_v1(draw: st.DrawFn) -> Message:
    body, reason = draw(st.sampled_from([
        ({"id": "x", "args": []}, "has no 'task' header and its body is not a version 1 task"),
        ({"task": "apps.basic.echo", "id": _id(), "args": "1"}, "body args must be a list"),
        ({"task": "apps.basic.echo", "id": _id(), "args": [1], "kwargs": [1]},
         "body kwargs must be an object"),
        ({"task": 7, "id": _id(), "args": [1]}, "header 'task' must be a string"),
        ({"task": "apps.basic.echo", "args": [1]}, "header 'id' is missing"),
        (["no", "task"], "has no 'task' header and its body is not a version 1 task"),
    ]))
    return Message(json.dumps(body).encode(), {"lang": "py"}, reason=reason)


@st.composite
def garbage(draw: st.DrawFn) -> Message:
    def undecodable(data: bytes) -> bool:
        try:
            json.loads(data)
        except ValueError:
            return True
        return False

    body = draw(st.binary(min_size=1, max_size=200).filter(undecodable))
    return Message(body, headers_for("apps.basic.add"), reason=UNDECODABLE)


@st.composite
def unknown_task(draw: st.DrawFn) -> Message:
    name = draw(st.text(min_size=1, max_size=30).filter(lambda n: n.strip() and not n.startswith("apps.")))
    return Message(v2([1]), headers_for(name), reason="unknown task")


@st.composite
def bad_compression(draw: st.DrawFn) -> Message:
    scheme = draw(st.sampled_from(["nope", "zstd-99", "application/x-gzip", "application/x-bz2"]))
    return Message(v2([1]), headers_for("apps.basic.echo", {"compression": scheme}),
                   reason="kombu cannot decode it")


hostile_messages = st.one_of(
    wrong_header(), truncated_body(), oversized_body(), bad_encoding(), unknown_content_type(), too_deep(),
    wrong_shape(), bad_v1(), garbage(), unknown_task(), bad_compression(),
)


def each_reason_has_its_own_line(reasons: Sequence[str], lines: Sequence[str]) -> bool:
    """Whether every reason can be paired with a different line saying it (a bipartite matching:
    a generic reason such as "body cannot be decoded" also appears in more specific lines)."""
    owner: dict[int, int] = {}  # line -> reason

    def assign(reason: int, seen: set[int]) -> bool:
        for line, text in enumerate(lines):
            if reasons[reason] in text and line not in seen:
                seen.add(line)
                if line not in owner or assign(owner[line], seen):
                    owner[line] = reason
                    return True
        return False

    return all(assign(reason, set()) for reason in range(len(reasons)))
