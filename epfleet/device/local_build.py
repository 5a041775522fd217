"""What a device builds for its own hardware when nothing published is optimal here.

Which EPs here can build (``local_targets``, in the device's preference order), the
compile request for one of them (fingerprinted as the fleet fingerprints its own), and
the key under which a failed build is remembered so that it is not retried until the
source, ORT or an EP package changes. The build itself runs in a worker
(``epfleet.device.steps``).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import TYPE_CHECKING

import eps
from epfleet import RECIPE_VERSION, ort_version
from epfleet.device.cache import local_target_name
from epfleet.device.local_eps import LocalEps, ep_versions
from epfleet.formats.manifest import ModelEntry
from epfleet.hashing import sha256_bytes
from eps.base import DeviceType, LocalTarget, effective_tolerance

if TYPE_CHECKING:
    from epfleet.runtime.requests import CompileRequest


def build_key(entry: ModelEntry) -> str:
    """Identifies a local build: a new source, ORT or EP package retries a failed one."""
    return sha256_bytes(
        json.dumps([RECIPE_VERSION, entry.source.digest, ort_version(), ep_versions()]).encode()
    )[:16]


def local_targets(local: LocalEps, prefer: Sequence[DeviceType]) -> list[tuple[str, LocalTarget]]:
    """(EP, what it builds for) for every EP here that builds for a preferred device type,
    most preferred first."""
    order = {device: i for i, device in enumerate(prefer)}
    found = []
    for ep, devices in local.devices.items():
        target = eps.load(ep).local_target(devices)
        if target is not None and target.device in order:
            found.append((ep, target))
    return sorted(found, key=lambda pair: order[pair[1].device])


def local_request(model: str, entry: ModelEntry, ep: str, local: LocalTarget) -> CompileRequest:
    """The compile request of a local build, with the EP's defaults a spec would not
    override here."""
    # here, not at the top: a sync that builds nothing does not load the compile request's
    # models (and the spec's they use)
    from epfleet.runtime.requests import CompileRequest, fingerprinted, source_fields

    module = eps.load(ep)
    tolerance = effective_tolerance(module=module, provider_options=local.provider_options)
    return fingerprinted(
        CompileRequest(
            model=model,
            target=local_target_name(ep),
            ep=ep,
            device=local.device,
            provider_options=local.provider_options,
            input_shapes=entry.source.input_shapes,
            **source_fields(entry.source),  # type: ignore[arg-type]
            # as the fleet lays out a large source's variant: its weights stay in files
            embed_context=not (module.partitions_graph and entry.source.files),
            external_initializers=bool(entry.source.files),
            graph_optimization=module.default_graph_optimization,
            tolerance=tolerance.relative,
            abs_tolerance=tolerance.absolute,
            samples=entry.samples,
            fingerprint="",
        ),
        ort_version(),
        module.build_identity(),
    )
