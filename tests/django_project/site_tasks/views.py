"""Views that enqueue tasks: a plain one, an async one that awaits the result, and one that
enqueues after its transaction commits, as Django's documentation says."""

import asyncio
import functools

from django.db import transaction
from django.http import JsonResponse
from notes.models import Note

# (the tasks are imported where they are used: a task its backend refuses is then reported by
# manage.py check, not by the URL check's import of this module)


def add(request):
    from notes.tasks import add as add_task

    result = add_task.enqueue(int(request.GET["x"]), int(request.GET["y"]))
    return JsonResponse({"id": result.id, "status": result.status})


async def add_and_wait(request):
    from notes.tasks import add as add_task

    result = await add_task.aenqueue(int(request.GET["x"]), int(request.GET["y"]))
    for _ in range(600):
        await result.arefresh()
        if result.is_finished:
            break
        await asyncio.sleep(0.05)
    fetched = await add_task.aget_result(result.id)
    return JsonResponse({"id": result.id, "status": fetched.status, "value": fetched.return_value})


def order(request):
    """Writes a note and enqueues a task after the commit (or nothing, when ``?fail=1`` rolls back)."""
    from notes.tasks import write_note

    ids = []
    try:
        with transaction.atomic():
            Note.objects.create(text=request.GET["text"], pid=0)
            transaction.on_commit(functools.partial(lambda: ids.append(write_note.enqueue(
                request.GET["text"] + " (task)").id)))
            if request.GET.get("fail"):
                raise RuntimeError("rolled back")
    except RuntimeError:
        pass
    return JsonResponse({"ids": ids})
