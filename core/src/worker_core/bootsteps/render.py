"""Rendering resolved blueprints as Graphviz DOT, Mermaid, plain text or JSON."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from .graph import StepGraph
from .step import Step

if TYPE_CHECKING:
    from ..options import WorkerOptions

__all__ = ["FORMATS", "render"]

FORMATS = ("dot", "mermaid", "text", "json")  # also declared in the package, to stay lazy

LAST_MARK = "\u29c9"  # ⧉, as `celery graph bootsteps` marks the last step
CONDITIONAL_MARK = "\u2218"  # ∘, a step that exists only under a condition


def render(
    graphs: Sequence[StepGraph],
    options: WorkerOptions,
    fmt: str = "dot",
    *,
    show_disabled: bool = False,
    title: str = "",
    implementations: Mapping[str, str] | None = None,
) -> str:
    """Render blueprints (worker first, then consumer) in one of :data:`FORMATS`.

    :param implementations: for each slot (``"pool"``, ...), the chosen implementation and its
        distribution, shown on the step that runs it.
    """
    view = _View(options, show_disabled, dict(implementations or {}))
    if fmt == "dot":
        return _dot(graphs, view, title)
    if fmt == "mermaid":
        return _mermaid(graphs, view, title)
    if fmt == "text":
        return _text(graphs, view)
    if fmt == "json":
        return json.dumps(_data(graphs, view), indent=2, ensure_ascii=False) + "\n"
    raise ValueError(f"unknown format {fmt!r}; choose one of {', '.join(FORMATS)}")


class _View:
    def __init__(self, options: WorkerOptions, show_disabled: bool, implementations: dict[str, str]) -> None:
        self.options = options
        self.show_disabled = show_disabled
        self.implementations = implementations

    def implementation(self, step: Step[Any]) -> str | None:
        if step.slot is None:
            return None
        chosen = self.implementations.get(step.slot)
        return f"{step.slot}: {chosen}" if chosen else None


def _display(step: Step[Any]) -> str:
    if step.last:
        return LAST_MARK + step.name
    if step.conditional:
        return CONDITIONAL_MARK + step.name
    return step.name


def _lines(graph: StepGraph, step: Step[Any], view: _View, disabled: str | None,
           marks: bool = True) -> list[str]:
    # Graphviz's default fonts lack U+29C9, so DOT says "last step" in words (and by its shape).
    lines = [_display(step) if marks or not step.last else step.name]
    if step.last and not marks:
        lines.append("last step")
    description = step.describe(view.options)
    if description:
        lines.append(description)
    implementation = view.implementation(step)
    if implementation:
        lines.append(implementation)
    if step.condition is not None:
        lines.append(f"when {step.condition.description}")
    if disabled:
        lines.append(f"disabled: {disabled}")
    provider = graph.provider(step)
    if provider is not None:
        lines.append(f"from {provider}")
    return lines


def _shown(graph: StepGraph, show_disabled: bool) -> list[tuple[Step[Any], str | None]]:
    shown: list[tuple[Step[Any], str | None]] = [(step, None) for step in graph.order]
    if show_disabled:
        shown.extend(graph.disabled)
    return shown


def _shown_edges(graph: StepGraph, names: set[str]) -> list[tuple[str, str, str]]:
    """Requirement edges among shown steps, plus ``last`` edges only to steps nothing else needs."""
    edges = [(e.source, e.target, e.kind) for e in graph.edges if e.kind != "last"]
    needed = {target for _, target, _ in edges}
    result = [e for e in edges if e[0] in names and e[1] in names]
    for e in graph.edges:
        if e.kind == "last" and e.source in names and e.target in names and e.target not in needed:
            result.append((e.source, e.target, e.kind))
    return result


def _first_step(graph: StepGraph) -> str | None:
    return graph.order[0].name if graph.order else None


def _last_step(graph: StepGraph) -> str | None:
    for step in graph.order:
        if step.last:
            return step.name
    return graph.order[-1].name if graph.order else None


# -- DOT ---------------------------------------------------------------------------------------


def _q(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


def _dot(graphs: Sequence[StepGraph], view: _View, title: str) -> str:
    out = ["digraph bootsteps {"]
    graph_attrs = 'fontname="Helvetica", rankdir="BT", bgcolor="white", labelloc="t"'
    if title:
        graph_attrs += f", label={_q(title)}"
    out.append(f"    graph [{graph_attrs}];")
    out.append('    node [shape="box", style="filled", fontname="Helvetica", fontsize="11"];')
    out.append('    edge [arrowhead="vee", fontname="Helvetica", fontsize="9"];')
    for graph in graphs:
        shown = _shown(graph, view.show_disabled)
        names = {step.name for step, _ in shown}
        out.append(f"    subgraph {_q('cluster_' + graph.blueprint)} {{")
        out.append(f"        label={_q(graph.blueprint + ' blueprint')};")
        out.append('        style="rounded"; color="gray60";')
        for step, reason in shown:
            attrs_ = {"label": "\\n".join(line.replace("\\", "\\\\").replace('"', '\\"')
                                          for line in _lines(graph, step, view, reason, marks=False))}
            if step.last:
                attrs_.update(shape="parallelogram", fillcolor="slategray3")
            elif reason:
                attrs_.update(fillcolor="gray90", style="filled,dashed", fontcolor="gray40")
            elif step.requires or step.after:
                attrs_["fillcolor"] = "palegreen3"
            else:
                attrs_["fillcolor"] = "palegreen1"
            if step.conditional and not reason:
                attrs_["style"] = "filled,bold"
            rendered = ", ".join(
                f'{k}="{v}"' if k == "label" else f"{k}={_q(v)}" for k, v in attrs_.items()
            )
            out.append(f"        {_q(graph.blueprint + ':' + step.name)} [{rendered}];")
        out.append("    }")
        for source, target, kind in _shown_edges(graph, names):
            style = ""
            if kind == "last":
                style = ' [arrowhead="none", color="darkseagreen3"]'
            elif kind == "after":
                style = ' [style="dashed", label="after"]'
            out.append(
                f"    {_q(graph.blueprint + ':' + source)} -> {_q(graph.blueprint + ':' + target)}{style};"
            )
    for outer, inner in pairwise(graphs):
        host, first = _last_step(outer), _first_step(inner)
        if host and first:
            out.append(
                f"    {_q(inner.blueprint + ':' + first)} -> {_q(outer.blueprint + ':' + host)} "
                f'[style="dotted", label="runs inside"];'
            )
    out.append("}")
    return "\n".join(out) + "\n"


# -- Mermaid -----------------------------------------------------------------------------------


def _mid(blueprint: str, name: str) -> str:
    return "".join(c if c.isalnum() else "_" for c in f"{blueprint}_{name}")


def _mtext(text: str) -> str:
    return text.replace('"', "#quot;")


def _mermaid(graphs: Sequence[StepGraph], view: _View, title: str) -> str:
    out = []
    if title:
        out += ["---", f"title: {title}", "---"]
    out.append("flowchart BT")
    for graph in graphs:
        shown = _shown(graph, view.show_disabled)
        names = {step.name for step, _ in shown}
        out.append(f'    subgraph {graph.blueprint}["{graph.blueprint} blueprint"]')
        for step, reason in shown:
            label = _mtext("<br/>".join(_lines(graph, step, view, reason)))
            node = _mid(graph.blueprint, step.name)
            if step.last:
                out.append(f'        {node}[/"{label}"/]')
            elif step.conditional:
                out.append(f'        {node}(["{label}"])')
            else:
                out.append(f'        {node}["{label}"]')
            if reason:
                out.append(f"        style {node} stroke-dasharray: 5 5,fill:#eeeeee")
        out.append("    end")
        for source, target, kind in _shown_edges(graph, names):
            arrow = {"requires": "-->", "after": "-.->|after|", "last": "-.-"}[kind]
            out.append(f"    {_mid(graph.blueprint, source)} {arrow} {_mid(graph.blueprint, target)}")
    for outer, inner in pairwise(graphs):
        host, first = _last_step(outer), _first_step(inner)
        if host and first:
            out.append(f"    {_mid(inner.blueprint, first)} -.->|runs inside| {_mid(outer.blueprint, host)}")
    return "\n".join(out) + "\n"


# -- text --------------------------------------------------------------------------------------


def _text(graphs: Sequence[StepGraph], view: _View) -> str:
    out: list[str] = []
    for graph in graphs:
        out.append(f"{graph.blueprint} blueprint, start order:")
        width = max((len(_display(step)) for step in graph.order), default=0)
        for position, step in enumerate(graph.order, 1):
            provider = graph.provider(step)
            description = step.describe(view.options)
            notes = [description] if description else []
            implementation = view.implementation(step)
            if implementation:
                notes.append(implementation)
            if step.requires:
                notes.append("requires " + ", ".join(step.requires))
            if step.condition is not None:
                notes.append(f"when {step.condition.description}")
            if step.last:
                notes.append("last")
            detail = "; ".join(notes)
            out.append(
                f"  {position:>3}. {_display(step):<{width}}  {provider or '-'}"
                + (f"  [{detail}]" if detail else "")
            )
        if graph.disabled and view.show_disabled:
            left_out = ", ".join(f"{step.name} ({reason})" for step, reason in graph.disabled)
            out.append(f"  left out: {left_out}")
        out.append("")
    return "\n".join(out)


# -- JSON --------------------------------------------------------------------------------------


def _step_data(graph: StepGraph, step: Step[Any], view: _View, position: int | None,
               reason: str | None) -> dict[str, Any]:
    provider = graph.provider(step)
    return {
        "name": step.name,
        "position": position,
        "enabled": reason is None,
        "disabled_reason": reason,
        "description": step.describe(view.options),
        "slot": step.slot,
        "implementation": view.implementations.get(step.slot) if step.slot else None,
        "requires": list(step.requires),
        "after": list(step.after),
        "last": step.last,
        "conditional": step.conditional,
        "condition": step.condition.description if step.condition else None,
        "plugin": provider.plugin if provider else None,
        "distribution": provider.distribution if provider else None,
        "version": provider.version if provider else None,
    }


def _data(graphs: Sequence[StepGraph], view: _View) -> dict[str, Any]:
    return {
        "blueprints": [
            {
                "name": graph.blueprint,
                "order": list(graph.names),
                "steps": [_step_data(graph, step, view, i, None) for i, step in enumerate(graph.order, 1)]
                + [_step_data(graph, step, view, None, reason) for step, reason in graph.disabled],
                "edges": [{"from": e.source, "to": e.target, "kind": e.kind} for e in graph.edges],
            }
            for graph in graphs
        ]
    }
