"""Resolving bootsteps: order, last, conditions, cycles, missing requirements, duplicates."""

from __future__ import annotations

import pytest

from worker_core.bootsteps import Condition, Provider, Step, resolve
from worker_core.exceptions import StepConflictError, StepCycleError, StepMissingError
from worker_core.options import Autoscale, WorkerOptions

OPTIONS = WorkerOptions()
AUTOSCALE = Condition("--autoscale is given", lambda o: o.autoscale is not None)


def names(graph):
    return [step.name for step in graph.order]


def test_required_steps_start_before_the_steps_that_need_them():
    steps = [Step("Consumer", requires=["Pool"]), Step("Pool", requires=["Timer"]), Step("Timer")]
    assert names(resolve("worker", steps, OPTIONS)) == ["Timer", "Pool", "Consumer"]


def test_ties_are_broken_by_contribution_order_so_the_order_is_deterministic():
    steps = [Step("B"), Step("A"), Step("C", requires=["A"])]
    first = names(resolve("worker", steps, OPTIONS))
    assert first == ["B", "A", "C"]
    assert all(names(resolve("worker", steps, OPTIONS)) == first for _ in range(5))


def test_the_last_step_starts_after_every_other_step():
    steps = [Step("Consumer", last=True), Step("Timer"), Step("Extra", requires=["Timer"])]
    assert names(resolve("worker", steps, OPTIONS)) == ["Timer", "Extra", "Consumer"]


def test_after_orders_only_when_the_other_step_is_present():
    steps = [Step("Pool", after=["Hub", "Nowhere"]), Step("Hub")]
    assert names(resolve("worker", steps, OPTIONS)) == ["Hub", "Pool"]


def test_a_conditional_step_is_left_out_when_its_condition_fails_and_says_why():
    steps = [Step("Pool"), Step("Autoscaler", requires=["Pool"], condition=AUTOSCALE)]
    graph = resolve("worker", steps, OPTIONS)
    assert names(graph) == ["Pool"]
    assert [(s.name, reason) for s, reason in graph.disabled] == [
        ("Autoscaler", "only when --autoscale is given")
    ]
    with_autoscale = resolve("worker", steps, WorkerOptions(autoscale=Autoscale(4, 1)))
    assert names(with_autoscale) == ["Pool", "Autoscaler"]


def test_a_step_requiring_a_disabled_step_is_disabled_too():
    steps = [Step("Autoscaler", condition=AUTOSCALE), Step("ScaleMetrics", requires=["Autoscaler"])]
    graph = resolve("worker", steps, OPTIONS)
    assert names(graph) == []
    reasons = dict((s.name, r) for s, r in graph.disabled)
    assert reasons["ScaleMetrics"] == "requires 'Autoscaler', which is disabled"


def test_a_cycle_is_reported_with_its_path():
    steps = [Step("A", requires=["B"]), Step("B", requires=["C"]), Step("C", requires=["A"]), Step("D")]
    with pytest.raises(StepCycleError) as caught:
        resolve("worker", steps, OPTIONS)
    assert "A -> B -> C -> A" in str(caught.value)


def test_a_self_requirement_is_a_cycle():
    with pytest.raises(StepCycleError, match="Loner -> Loner"):
        resolve("worker", [Step("Loner", requires=["Loner"])], OPTIONS)


def test_a_missing_requirement_names_the_step_what_it_needs_and_a_close_name():
    steps = [Step("Pool"), Step("Metrics", requires=["Poll"])]
    providers = [Provider("worker"), Provider("metrics", "acme-metrics", "2.0")]
    with pytest.raises(StepMissingError) as caught:
        resolve("worker", steps, OPTIONS, providers)
    message = str(caught.value)
    assert "'Metrics'" in message and "'Poll'" in message
    assert "acme-metrics 2.0" in message
    assert "Did you mean 'Pool'?" in message


def test_two_steps_with_one_name_are_an_error_naming_both_providers():
    steps = [Step("Pool"), Step("Pool")]
    providers = [Provider("worker", "worker-core", "0.1.0"), Provider("fastpool", "acme-pool", "1.0")]
    with pytest.raises(StepConflictError) as caught:
        resolve("worker", steps, OPTIONS, providers)
    assert "worker-core" in str(caught.value) and "acme-pool" in str(caught.value)


def test_two_last_steps_are_an_error():
    with pytest.raises(StepConflictError, match="more than one last step"):
        resolve("worker", [Step("A", last=True), Step("B", last=True)], OPTIONS)


def test_requiring_the_last_step_is_refused_with_an_explanation():
    with pytest.raises(StepCycleError, match="is the last step"):
        resolve("worker", [Step("Consumer", last=True), Step("Late", requires=["Consumer"])], OPTIONS)


def test_a_step_needs_a_name():
    from worker_core.exceptions import StepError

    with pytest.raises(StepError, match="non-empty name"):
        Step("  ")
    with pytest.raises(StepError, match="not the string"):
        Step("A", requires="B")


def test_class_declared_steps_read_like_constructed_ones():
    class Metrics(Step):
        name = "Metrics"
        requires = ("Pool",)
        condition = AUTOSCALE

    step = Metrics()
    assert (step.name, step.requires, step.conditional) == ("Metrics", ("Pool",), True)
