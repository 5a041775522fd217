"""Where things live in a store: every object key epfleet writes, in one place (pure)."""

from __future__ import annotations

import re

_TEMP_NAME = re.compile(r"\.(?P<name>.+)\.[a-z0-9_]{8}\.tmp")


def source_key(sha256: str) -> str:
    return f"sources/{sha256}.onnx"


def samples_key(sha256: str) -> str:
    return f"samples/{sha256}.npz"


def variant_key(model: str, target: str, sha256: str) -> str:
    return f"variants/{model}/{target}/{sha256}.onnx"


def delta_key(model: str, target: str, sha256: str, base_sha256: str) -> str:
    """A binary delta that turns the variant file ``base_sha256`` (of any target of the
    model) into the ``target`` variant's file ``sha256`` (``epfleet.deltas``)."""
    return f"{DELTAS_PREFIX}{model}/{target}/{sha256}.from-{base_sha256}.zst"


DELTAS_PREFIX = "deltas/"


def listing_key(artifact_key: str) -> str:
    """Beside a multi-file variant's main file, the list of its other files (JSON): what
    ``epfleet gc`` keeps of a variant a device runs after the manifest dropped it."""
    return artifact_key.removesuffix(".onnx") + ".files.json"


def files_key(sha256: str) -> str:
    """Where a file beside a main model (external data, EP context, sidecar) is stored:
    content-addressed, so a file shared by a source and all its variants is stored once."""
    return f"files/{sha256}"


def signature_key(artifact_key: str) -> str:
    """Beside a variant's main file, its OpenSSF model signature (a Sigstore bundle over
    the variant's file, or its directory when it has files beside the main one)."""
    return artifact_key + ".sig"


MODEL_SIGNING_PUBLIC_KEY = "trust/model-signing.pub"
"""The public key of the store's model signatures (PEM)."""


def is_temp_name(name: str, of: str | None = None) -> bool:
    """``name`` is the temporary file of an atomic write (``epfleet.fsutil``; of the file
    named ``of``)."""
    match = _TEMP_NAME.fullmatch(name)
    return match is not None and (of is None or match["name"] == of)
