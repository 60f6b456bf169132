"""The SDK's in-memory span exporter, which also writes each span it is given as one JSON line
to ``$WORKER_TEST_SPANS/<pid>.jsonl``: the spans a worker's processes export, for the tests to
read. The tests install it as the exporter ``jsonl`` of the SDK's ``opentelemetry_traces_exporter``
entry points (:func:`exporter_site`), so a worker with ``--otel`` and
``OTEL_TRACES_EXPORTER=jsonl`` exports to it with no code in the app."""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

__all__ = ["JsonLinesExporter", "exporter_site", "read_spans", "span_record"]


def span_record(span: Any) -> dict[str, Any]:
    return {"name": span.name, "kind": span.kind.name, "trace_id": format(span.context.trace_id, "032x"),
            "span_id": format(span.context.span_id, "016x"),
            "parent_id": format(span.parent.span_id, "016x") if span.parent else None,
            "status": span.status.status_code.name,
            "attributes": {key: value if isinstance(value, (str, int, float, bool)) else list(value)
                           for key, value in (span.attributes or {}).items()},
            "events": [event.name for event in span.events], "pid": os.getpid(),
            "scope": span.instrumentation_scope.name if span.instrumentation_scope else None}


class JsonLinesExporter(InMemorySpanExporter):
    def export(self, spans: Sequence[Any]) -> SpanExportResult:
        result = super().export(spans)
        folder = os.environ.get("WORKER_TEST_SPANS")
        if folder:
            with open(Path(folder) / f"{os.getpid()}.jsonl", "a") as file:
                for span in spans:
                    file.write(json.dumps(span_record(span)) + "\n")
        return result


def read_spans(folder: Path) -> list[dict[str, Any]]:
    found = []
    for path in sorted(folder.glob("*.jsonl")):
        found.extend(json.loads(line) for line in path.read_text().splitlines() if line.strip())
    return found


def exporter_site(root: Path) -> Path:
    """A folder to put on PYTHONPATH that makes this exporter the SDK's ``jsonl`` exporter."""
    info = root / "worker_test_exporter-1.0.dist-info"
    info.mkdir(parents=True, exist_ok=True)
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: worker-test-exporter\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[opentelemetry_traces_exporter]\n"
                                           "jsonl = otel_spans:JsonLinesExporter\n")
    return root
