"""``epfleet verify-model``: check published variants against their OpenSSF model
signatures, as ``model_signing verify key`` does (``epfleet.trust.model_signatures``)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

from cyclopts import Parameter

from epfleet.cli.exit_codes import EXIT_FAILED, EXIT_OK
from epfleet.cli.options import Json, Repeatable, Store, TrustRoot, pin_trust_root
from epfleet.errors import BadInputError
from epfleet.logs import say
from epfleet.stores import DEFAULT_STORE
from epfleet.text import show

PublicKey = Annotated[
    Path | None,
    Parameter(
        help="The model-signing public key (PEM) to verify with, as the publisher gave it "
        "to you; default: the store's trust/model-signing.pub."
    ),
]


def verify_model(
    *,
    store: Store = DEFAULT_STORE,
    model: Repeatable = None,
    public_key: PublicKey = None,
    trust_root: TrustRoot = None,
    as_json: Json = False,
) -> int:
    """Download each published variant and check it against its OpenSSF model signature
    (<artifact key>.sig) with the model-signing public key, offline, as model_signing verify
    key does: every file it lists, with its sha256, and no other file.

    For example:
      epfleet verify-model --store ./epfleet-store
      epfleet verify-model --store s3://bucket/fleet --model tiny-cls \\
        --public-key fleet.pub

    Exit codes: 0 every variant verified; 1 one did not, or the store failed; 2 bad input.

    Parameters
    ----------
    model
        Only this model's variants (repeatable; default: every model).
    as_json
        Print one object per variant: model, target, signature key, problem (null when
        it verified).
    """
    from epfleet.fleet.publishing.publish import read_in_force
    from epfleet.formats.keys import MODEL_SIGNING_PUBLIC_KEY
    from epfleet.stores import open_store
    from epfleet.trust.model_signatures import published_public_key, verify_published

    pin_trust_root(store, trust_root)
    opened = open_store(store)
    manifest = read_in_force(opened).manifest
    if manifest is None:
        raise BadInputError(f"no manifest at {store}/manifest.json: run epfleet compile first")
    if public_key is not None:
        try:
            public_pem = public_key.read_bytes()
        except OSError as exc:
            raise BadInputError(f"--public-key {public_key}: {exc.strerror or exc}") from None
    else:
        found = published_public_key(opened)
        if found is None:
            raise BadInputError(
                f"{store} publishes no {MODEL_SIGNING_PUBLIC_KEY}: it has no model signatures "
                "(publish with EPFLEET_MODEL_SIGNER set, or run epfleet trust sign-models)"
            )
        public_pem = found
    unknown = sorted(set(model or []) - set(manifest.models))
    if unknown:
        raise BadInputError(f"no model {', '.join(unknown)} in {store}'s manifest")
    checks = verify_published(opened, manifest, public_pem, model)
    if as_json:
        rows = [
            {"model": c.model, "target": c.target, "signature": c.signature, "problem": c.problem}
            for c in checks
        ]
        sys.stdout.write(json.dumps(rows, indent=2) + "\n")
    else:
        for check in checks:
            verdict = "verified" if check.problem is None else f"REFUSED: {check.problem}"
            show(f"{check.model} × {check.target}: {verdict}")
    failed = [c for c in checks if c.problem is not None]
    if failed:
        say(f"epfleet: {len(failed)} of {len(checks)} variants do not match their model signature")
        return EXIT_FAILED
    return EXIT_OK
