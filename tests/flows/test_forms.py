"""The Prefect UI's forms of every flow: built from each flow's parameter JSON
schema, which Prefect derives from the signature and docstring. A parameter whose empty
value means "all" or "as configured" must render as a usable input: no ``anyOf`` with
null (the UI shows a ``list | None`` toggle set to None, 'Property is type "None"');
the form does not show numeric bounds, so each bounded parameter's description states
them; every parameter is described. The forms as rendered were checked in Chromium
against a real ``prefect server``."""

from __future__ import annotations

import re
from typing import Any

import pytest
import yaml
from prefect.utilities.callables import parameter_schema

from flows.compile_pairs import compile_pairs
from flows.device_sync import device_sync
from flows.fleet_compile import fleet_compile
from flows.rollout_gate import rollout_gate
from flows.runtime_watch import runtime_watch
from flows.trust_refresh import trust_refresh
from tests.support.paths import REPO

pytestmark = pytest.mark.fast

FLOWS = [fleet_compile, device_sync, runtime_watch, trust_refresh, compile_pairs, rollout_gate]
FORM_MODELS = {device_sync: ["SyncPolicy"]}
"""Model parameters a person fills in, field by field. (compile-pairs' ``pairs`` are
written by the fleet-compile flow that starts it, manifest entries and all.)"""


def properties(flow: Any) -> list[tuple[str, dict[str, Any]]]:
    """Every parameter, and every field of a model parameter a person fills in."""
    schema = parameter_schema(flow.fn).model_dump()
    found = list(schema["properties"].items())
    for name in FORM_MODELS.get(flow, []):
        fields = schema["definitions"][name]["properties"]
        found += [(f"{name}.{k}", v) for k, v in fields.items()]
    return found


def test_every_deployed_flow_is_checked() -> None:
    """A flow added to deployments/prefect.yaml gets its form checked here too."""
    spec = yaml.safe_load((REPO / "deployments" / "prefect.yaml").read_text())
    deployed = {d["entrypoint"].rsplit(":", 1)[1] for d in spec["deployments"]}
    assert deployed <= {f.fn.__name__ for f in FLOWS}


@pytest.mark.parametrize("flow", FLOWS, ids=lambda f: f.name)
def test_no_parameter_is_a_toggle_to_none(flow: Any) -> None:
    nullable = [
        name
        for name, prop in properties(flow)
        if any(option.get("type") == "null" for option in prop.get("anyOf", []))
    ]
    assert nullable == [], f"{flow.name}: rendered as a toggle set to None: {nullable}"


@pytest.mark.parametrize("flow", FLOWS, ids=lambda f: f.name)
def test_bounds_are_in_the_description(flow: Any) -> None:
    for name, prop in properties(flow):
        low, high = prop.get("minimum"), prop.get("maximum")
        if low is None and high is None:
            continue
        said = prop.get("description", "")
        bound = f"{low} to {high}" if high is not None else f"{low} or more"
        assert bound in " ".join(said.split()), f"{flow.name}.{name}: {said!r} lacks {bound!r}"


@pytest.mark.parametrize("flow", FLOWS, ids=lambda f: f.name)
def test_every_parameter_is_described(flow: Any) -> None:
    for name, prop in properties(flow):
        assert prop.get("description"), f"{flow.name}.{name} has no description"


ALL_WHEN_EMPTY = {
    fleet_compile: ["models", "targets"],
    device_sync: ["SyncPolicy.models"],
}


@pytest.mark.parametrize("flow", list(ALL_WHEN_EMPTY), ids=lambda f: f.name)
def test_all_when_empty_lists_default_to_empty(flow: Any) -> None:
    props = dict(properties(flow))
    schema = parameter_schema(flow.fn).model_dump()
    for name in ALL_WHEN_EMPTY[flow]:
        prop = props[name]
        assert prop["type"] == "array" and prop["items"] == {"type": "string"}, name
        if "." not in name:
            assert prop["default"] == [], name
        else:
            assert schema["properties"]["policy"]["default"]["models"] == []
        assert re.search(r"empty: every", prop["description"]), prop["description"]
