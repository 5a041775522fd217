"""``epfleet trust``: the signed (TUF) metadata of a store: ``init``, ``rotate``,
``refresh`` and ``status``.

Exit codes as every epfleet command: 0 ok, 1 the store failed, 2 bad input (an option
named). The repository code is imported inside each command.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

from cyclopts import App, Parameter

from epfleet.cli.exit_codes import EXIT_OK
from epfleet.cli.options import Json, Store, TrustRoot, command_help, pin_trust_root
from epfleet.errors import BadInputError
from epfleet.stores import DEFAULT_STORE
from epfleet.text import show

trust_app = App(
    name="trust",
    help="The signed (TUF) metadata devices verify a store with: create it, rotate its "
    "keys, keep it fresh, show it.",
    help_epilogue="",
)

Keys = Annotated[
    Path,
    Parameter(help="The offline key directory (root-N.pem, targets.pem): keep it offline."),
]
OnlineSigner = Annotated[
    str | None,
    Parameter(
        help="The online key's securesystemslib signer URI (file2:<path>, awskms:, gcpkms:, "
        "azurekms:, hv:); default EPFLEET_TRUST_SIGNER"
    ),
]
OnlinePublicKey = Annotated[
    Path | None,
    Parameter(help="The online key's public key (PEM), for a KMS signer URI."),
]


@trust_app.command
def init(
    *,
    store: Store = DEFAULT_STORE,
    keys: Keys,
    online_signer: OnlineSigner = None,
    online_public_key: OnlinePublicKey = None,
    root_keys: int = 3,
    root_threshold: int = 2,
    bins: int = 256,
    adopt: bool = False,
    force: bool = False,
) -> int:
    """Create the store's signed metadata: root (a threshold of offline keys), targets
    (an offline key), and the online key that signs bins, snapshot and timestamp; then
    sign the store's manifest.json. New key files go to --keys (0600); without
    --online-signer or EPFLEET_TRUST_SIGNER an online key file is made there too.

    A store that already holds a manifest.json was published unsigned: init lists what it
    holds (models, variants, store objects, rollouts, device keys) and signs it only with
    --adopt, once you have checked it. A store that was signed before (this host's worker
    cache or its development keys pin a root for it) is refused: restore its trust/ from a
    backup instead.

    For example:
      epfleet trust init --store s3://bucket/fleet --keys /media/offline/fleet-keys
      epfleet trust init --store ./epfleet-store --keys ./keys \\
        --online-signer awskms:... --online-public-key online.pub.pem

    Keep --keys out of any git work tree: a directory inside one that git does not ignore
    is refused (--force writes there anyway). Nothing is left in --keys when init fails:
    run the same command again.

    Exit codes: 0 created; 1 the store failed; 2 bad input (the store has or had trust
    metadata, holds a manifest.json and --adopt is not given, --keys holds keys or is in a
    git work tree that does not ignore it, an impossible threshold or bin count).

    Parameters
    ----------
    root_keys
        How many root keys to create.
    root_threshold
        How many root keys must sign a new root.
    bins
        How many hashed bins the targets are spread over (a power of two; fixed for good:
        devices cache them).
    adopt
        Sign the manifest.json the store holds, as it is (listed when refused without it).
    force
        Write the keys into a git work tree that does not ignore --keys.
    """
    from epfleet.settings import settings
    from epfleet.stores import open_store
    from epfleet.trust.creation import manifest_summary
    from epfleet.trust.key_location import check_keys_location
    from epfleet.trust.repository import init_with_key_files, read_state

    check_keys_location(keys, force=force)

    uri = online_signer or settings().trust_signer
    opened = open_store(store)
    root_file, uri = init_with_key_files(
        opened,
        keys,
        online_uri=uri,
        online_public_key=online_public_key,
        root_keys=root_keys,
        root_threshold=root_threshold,
        bins=bins,
        adopt=adopt,
    )
    show(
        f"created the signed metadata of {store} ({bins} bins, root {root_threshold} of "
        f"{root_keys} keys in {keys})"
    )
    signed = read_state(opened).document
    if signed is not None:
        show(f"signed the manifest.json it held: {manifest_summary(signed)}")
    show(f"provision devices with: epfleet sync --trust-root {root_file}")
    show(f"publishers sign with: EPFLEET_TRUST_SIGNER={uri}")
    return EXIT_OK


@trust_app.command
def rotate(
    *,
    store: Store = DEFAULT_STORE,
    keys: Keys,
    online_signer: OnlineSigner = None,
    online_public_key: OnlinePublicKey = None,
    root: bool = False,
    root_keys: int | None = None,
    root_threshold: int | None = None,
) -> int:
    """Replace the online key (--online-signer) or the root keys (--root). Devices follow:
    a new root version, signed by the old keys and the new ones, names the new keys.

    For example:
      epfleet trust rotate --store s3://bucket/fleet \\
        --keys /media/offline/fleet-keys --online-signer file2:/secure/online-2.pem
      epfleet trust rotate --store s3://bucket/fleet \\
        --keys /media/offline/fleet-keys --root

    Exit codes: 0 rotated; 1 the store failed; 2 bad input.

    Parameters
    ----------
    root
        New root keys: written to --keys as root-1.pem ..; the old ones move to
        --keys/retired/<root version>/.
    root_keys
        How many new root keys (default: as many as now).
    root_threshold
        The new root threshold (default: unchanged).
    """
    from epfleet.stores import open_store
    from epfleet.trust.keys import (
        load_offline,
        new_key,
        public_key_of,
        replace_root_keys,
        restore_root_keys,
    )
    from epfleet.trust.keys import online_signer as load_signer
    from epfleet.trust.repository import (
        check_offline_keys,
        latest_root,
        rotate_online_key,
        rotate_root_keys,
    )

    if root == (online_signer is not None):
        raise BadInputError("give exactly one of --online-signer URI and --root")
    opened = open_store(store)
    offline = load_offline(keys)
    if online_signer is not None:
        signer = load_signer(online_signer, public_key_of(online_signer, online_public_key))
        done = rotate_online_key(opened, offline, signer)
        show(f"rotated the online key of {store}: timestamp version {done.version}")
        show(f"publishers sign with: EPFLEET_TRUST_SIGNER={online_signer}")
        return EXIT_OK
    check_offline_keys(opened, offline)
    version = latest_root(opened).signed.version
    new_root = [new_key() for _ in range(root_keys or len(offline.root))]
    # The new keys are on disk before any root names them: a crash loses no key.
    replace_root_keys(offline, new_root, version)
    try:
        rotate_root_keys(opened, offline, list(new_root), threshold=root_threshold)
    except BaseException:
        restore_root_keys(keys, version)  # no root names the new keys: the old stay in force
        raise
    show(
        f"rotated the root keys of {store}: root version {version + 1}; the old keys are "
        f"in {keys / 'retired' / str(version)}"
    )
    return EXIT_OK


@trust_app.command
def refresh(*, store: Store = DEFAULT_STORE, trust_root: TrustRoot = None) -> int:
    """Sign the timestamp and snapshot again (and bins near expiry), so devices never see
    expired metadata while nothing is published. Signs with EPFLEET_TRUST_SIGNER, from the
    signed metadata alone; then puts manifest.json right as the copy of the signed
    manifest, warning of entries someone without the keys changed in it.

    For example:
      EPFLEET_TRUST_SIGNER=awskms:... epfleet trust refresh --store s3://bucket/fleet

    Exit codes: 0 refreshed; 1 the store failed; 2 no trust metadata or no signer.
    """
    from epfleet.fleet.publishing.publish import put_copy_right
    from epfleet.stores import open_store
    from epfleet.trust.pins import signed_store
    from epfleet.trust.repository import refresh as refresh_trust
    from epfleet.trust.signers import signer_for

    pin_trust_root(store, trust_root)
    opened = open_store(store)
    if not signed_store(opened):
        raise BadInputError(f"--store {store} has no trust metadata: epfleet trust init first")
    signer = signer_for(opened)
    assert signer is not None  # a store with trust metadata has one or raised
    done = refresh_trust(opened, signer)
    put_copy_right(opened)  # warns of entries changed without the keys
    show(
        f"refreshed the signed metadata of {store}: timestamp version {done.version}"
        f"{', bins ' + ', '.join(done.bins) if done.bins else ''}"
    )
    return EXIT_OK


@trust_app.command
def sign_models(
    *,
    store: Store = DEFAULT_STORE,
    public_key: Annotated[
        Path | None,
        Parameter(help="The model-signing key's public key (PEM), for a KMS signer."),
    ] = None,
    trust_root: TrustRoot = None,
) -> int:
    """Sign every variant the manifest keeps with the model-signing key (EPFLEET_MODEL_SIGNER,
    or a local store's development key), then publish its public key as
    trust/model-signing.pub: a store's first OpenSSF model signatures, or a new key in
    place of the old one. Publishes sign their new variants themselves afterwards.

    For example:
      EPFLEET_MODEL_SIGNER=file2:/secure/model-signing-2.pem \\
        epfleet trust sign-models --store s3://bucket/fleet
      EPFLEET_MODEL_SIGNER=awskms:... epfleet trust sign-models --store s3://bucket/fleet \\
        --public-key model-signing.pub

    Exit codes: 0 signed; 1 the store failed; 2 no signer or bad input.
    """
    from epfleet.fleet.publishing.publish import read_in_force
    from epfleet.stores import open_store
    from epfleet.trust.model_signatures import load_model_signer, model_signer_uri, sign_all

    pin_trust_root(store, trust_root)
    opened = open_store(store)
    uri = model_signer_uri(opened)
    if uri is None:
        raise BadInputError(
            "EPFLEET_MODEL_SIGNER is not set: set it to the model-signing key's signer URI "
            "(e.g. file2:/path/to/model-signing.pem)"
        )
    try:
        public_pem = public_key.read_bytes() if public_key is not None else None
    except OSError as exc:
        raise BadInputError(f"--public-key {public_key}: {exc.strerror or exc}") from None
    signer = load_model_signer(uri, public_pem)
    written = sign_all(opened, signer, read_in_force(opened).manifest)
    show(
        f"signed {len(written)} variants of {store} and published its model-signing key "
        "as trust/model-signing.pub"
    )
    return EXIT_OK


@trust_app.command
def status(*, store: Store = DEFAULT_STORE, as_json: Json = False) -> int:
    """Show the signed metadata: each role's version and expiry, and the bin count; with
    enrolled device keys, the keys index's and the key bin that expires first (epfleet
    trust refresh signs both again when half their life is gone).

    For example:
      epfleet trust status --store s3://bucket/fleet

    Exit codes: 0 shown; 1 the store failed; 2 no trust metadata.
    """
    from epfleet.stores import open_store
    from epfleet.trust.device_keys import keys_status
    from epfleet.trust.repository import read_state
    from epfleet.trust.repository import status as trust_status

    opened = open_store(store)
    rows, bins = trust_status(opened)
    rows += keys_status(opened, read_state(opened))
    if as_json:
        document = {
            "bins": bins,
            "roles": [
                {"role": r.role, "version": r.version, "expires": r.expires.isoformat()}
                for r in rows
            ],
        }
        print(json.dumps(document, indent=2))
        return EXIT_OK
    width = max(len(r.role) for r in rows)
    for r in rows:
        show(f"{r.role:<{width}}  version {r.version:<6} expires {r.expires:%Y-%m-%d %H:%M} UTC")
    show(f"{bins} hashed bins")
    return EXIT_OK


command_help(init, rotate, refresh, status)
