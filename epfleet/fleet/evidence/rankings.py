"""The field rankings in a store's signed metadata, refreshed by the rollout gate.

Each gate pass tallies the latency its reports give (``ranking_rules``, the gate's own
attribution) and signs the rankings as TUF targets ``field/rankings/<model>/<n>`` in the
bin of each model's ``models/<model>`` (``epfleet.trust.targets.ranking_target``), by the
same online key
(``epfleet.trust.signing``, ``Changes.rankings``). They are a side document, not a field
of the manifest: a ranking that moves with every pass would otherwise give the manifest a
new generation, a new ``manifest.json`` and a new entry for every model it ranks; as
targets, a pass that changes nothing signs nothing, and one that changes a model's
ranking re-signs one bin, the snapshot and the timestamp. Publishes of the manifest
carry the rankings signed before them as they are.

An unsigned store gets no rankings: its devices trust nothing they could come from.
"""

from __future__ import annotations

from pydantic import BaseModel, Field

from epfleet.formats.field_ranking import ModelRanking
from epfleet.stores import Store
from epfleet.trust.pins import signed_store
from epfleet.trust.signers import signer_for
from epfleet.trust.signing import Changes, publish_signed
from epfleet.trust.state import read_state
from epfleet.trust.targets import ranking_targets


class RankingsPublished(BaseModel):
    models: int = Field(description="Models ranked")
    signed: bool = Field(description="Whether new signed metadata was written")
    bins: list[str] = Field(default_factory=list, description="The bins signed again")
    skipped: str | None = Field(default=None, description="Why nothing could be signed")


def publish_rankings(store: Store, rankings: dict[str, ModelRanking]) -> RankingsPublished:
    """Sign ``rankings`` in place of the rankings signed in ``store`` now (nothing when
    they are the same)."""
    if not signed_store(store):
        return RankingsPublished(
            models=len(rankings),
            signed=False,
            skipped=f"{store.uri} has no trust metadata: field rankings are signed only",
        )
    signer = signer_for(store)
    assert signer is not None  # a signed store has a signer, or signer_for raised
    succinct = read_state(store).succinct  # fixed when the repository was created
    dumped = {m: r.model_dump(mode="json") for m, r in rankings.items()}
    targets = ranking_targets(dumped, succinct)
    done = publish_signed(store, signer, None, Changes(rankings=targets))
    return RankingsPublished(models=len(rankings), signed=done.written, bins=done.bins)
