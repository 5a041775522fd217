"""The ``trust-refresh`` flow: sign a store's TUF timestamp and snapshot again (and the
bins near expiry) before they expire, so devices keep verifying while nothing is
published, from the signed metadata alone. Compare-and-swap as every publish: a publish
racing it loses nothing. Then ``manifest.json`` is put right as the copy of the signed
manifest (``epfleet.formats.manifest.tampered`` names the entries someone without keys changed).

    python flows/trust_refresh.py --store s3://bucket/fleet

signs with the online key ``EPFLEET_TRUST_SIGNER`` (a local store's development key when
unset). A store without trust metadata has nothing to refresh: the run says so and
completes.
"""

# No `from __future__ import annotations`: see flows/device_sync.py.
import runpy
import sys

from prefect import flow, get_run_logger
from prefect.artifacts import create_table_artifact

from epfleet.fleet.publishing.publish import put_copy_right
from epfleet.stores import DEFAULT_STORE, open_store
from epfleet.trust.pins import signed_store
from epfleet.trust.repository import refresh, status
from epfleet.trust.signers import signer_for
from tasks.events import emit_tampered_event


@flow(
    name="trust-refresh",
    description="Sign the store's TUF timestamp and snapshot again, and the bins near "
    "expiry, before devices would find them expired.",
)
def trust_refresh(store: str = DEFAULT_STORE) -> int | None:
    """Refresh the signed metadata's expiries; returns the new timestamp version (None for
    a store without trust metadata).

    Args:
        store: Store URI: a directory, file:///abs/dir or s3://bucket/prefix.
    """
    logger = get_run_logger()
    opened = open_store(store)
    if not signed_store(opened):
        logger.warning("%s has no trust metadata: nothing to refresh (epfleet trust init)", store)
        return None
    signer = signer_for(opened)
    assert signer is not None  # a store with trust metadata has one, or signer_for raised
    done = refresh(opened, signer)
    emit_tampered_event(put_copy_right(opened), store)
    logger.info(
        "signed timestamp version %d%s",
        done.version,
        f"; bins signed again: {', '.join(done.bins)}" if done.bins else "",
    )
    rows, bins = status(opened)
    create_table_artifact(
        key="trust-refresh-expiries",
        table=[
            {"role": r.role, "version": r.version, "expires": f"{r.expires:%Y-%m-%d %H:%M} UTC"}
            for r in rows
        ],
        description=f"Signed metadata of {store} after the refresh ({bins} hashed bins)",
    )
    return done.version


if __name__ == "__main__":
    # The epfleet command's own entry point (``python -m epfleet``), not an import of it:
    # the CLI imports the flows, so a flow importing the CLI would close a circle.
    sys.argv[1:1] = ["trust", "refresh"]
    runpy.run_module("epfleet", run_name="__main__", alter_sys=True)
