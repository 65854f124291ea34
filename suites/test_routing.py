"""Routing: a fused bundle reaches the fused llama-cpp backend, and the routed plan arrives.

The decision is checked where it is made (the planner) and where it lands: the running
server's ``/props`` names the bundle's text model and its log shows the drafter the plan
named being loaded.
"""

from __future__ import annotations

import re

import pytest

from harness.client import ServerClient
from harness.facts.catalog import RuntimeClass
from harness.planning.routing import InferenceBackend, RouteReason
from harness.plugin import LaunchPlanned, PlanFor

pytestmark = pytest.mark.server

_LOADING_DRAFTER = re.compile(r"loading draft model '([^']+)'")


def test_fused_bundle_routes_to_the_fused_llama_cpp_backend(plan_for: PlanFor,
                                                           any_bundle: str) -> None:
    """Every bundle: the fixtures' and the user's (``--harness-bundles``)."""
    plan = plan_for(bundle=any_bundle)
    assert plan.route.backend is InferenceBackend.LLAMA_CPP
    assert plan.route.fused
    assert plan.route.reason is RouteReason.CATALOG
    assert plan.catalog is not None
    assert plan.catalog.runtime_class is RuntimeClass.FUSED


def test_no_catalog_entry_routes_to_llama_cpp_by_default(plan_for: PlanFor) -> None:
    plan = plan_for(model="dense")
    assert plan.route.backend is InferenceBackend.LLAMA_CPP
    assert not plan.route.fused
    assert plan.route.reason is RouteReason.DEFAULT


@pytest.mark.parametrize("target", [{"bundle": "fused-dense"}, {"model": "dense"}],
                         ids=["bundle", "bare-model"])
def test_env_override_wins_and_says_so(plan_for: PlanFor, target: dict[str, str]) -> None:
    plan = plan_for(**target, environ={"HARNESS_INFERENCE_BACKEND": "llama-cpp"})
    assert plan.route.reason is RouteReason.ENV_OVERRIDE
    assert "HARNESS_INFERENCE_BACKEND=llama-cpp" in plan.route.detail
    assert plan.route.detail in plan.reasons


def test_fused_dense_plan_arrives_on_the_server(plan_for: PlanFor, launch: LaunchPlanned) -> None:
    plan = plan_for(bundle="fused-dense")
    assert plan.bundle_root is not None
    assert plan.spec.drafter is not None
    server = launch(plan)
    with ServerClient(server.base_url) as client:
        assert client.props().model_path == str(plan.bundle_root / "text" / "tiny-dense.gguf")
    loaded = _LOADING_DRAFTER.findall(server.log_text())
    assert loaded == [str(plan.spec.drafter)], "the log must show the planned drafter loading"


def test_fused_mtp_plan_arrives_on_the_server(plan_for: PlanFor, launch: LaunchPlanned) -> None:
    plan = plan_for(bundle="fused-mtp")
    assert plan.spec.drafter is None
    assert plan.spec.spec_type == "draft-mtp"
    server = launch(plan)
    with ServerClient(server.base_url) as client:
        assert client.props().model_path == str(plan.spec.model)
    log = server.log_text()
    assert not _LOADING_DRAFTER.findall(log), "an MTP head needs no separate drafter file"
    assert "creating MTP draft context against the target model" in log
