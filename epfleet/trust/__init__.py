"""Signed distribution with The Update Framework (TUF, python-tuf ``tuf`` 7.x).

The contract between the publishing side (``epfleet.trust.repository``) and the device
side (``epfleet.trust.client``). Everything lives in the store under ``trust/``:

- ``trust/metadata/<v>.root.json``: every root version ever (devices walk the chain).
- ``trust/metadata/timestamp.json``: the only unversioned file; replaced with
  compare-and-swap (``Store.write(..., if_match=etag)``).
- ``trust/metadata/<v>.snapshot.json``, ``<v>.targets.json``, ``<v>.<bin>.json``:
  consistent snapshots, each version written once (``if_none_match=True``).
- Bins are succinct hash-bin delegations from ``targets`` (``SuccinctRoles``, name
  prefix ``bin``: ``bin-00`` .. ``bin-ff`` for 256). Their number is fixed at
  ``trust init`` (default 256) and read back from ``targets`` by every publisher.
- Target paths: ``models/<name>``, one per model. Its custom field ``epfleet`` is the
  model's manifest entry (``ModelEntry`` as JSON) with only its ``ok`` variants; the
  target file is that JSON, canonical (sorted keys, no spaces), stored at
  ``trust/targets/models/<sha256>.<name>``. Devices judge compatibility strings from the
  signed custom field and download artifacts against the sha256 and size it carries.
- Target path ``manifest.json``: the whole published manifest, stored at
  ``trust/targets/<sha256>.manifest.json``; a device that wants every model downloads
  it through TUF instead of asking each bin.
- Enrolled device keys: targets ``device-keys/<device id>`` and ``device-key-ids/<key id>``
  in succinct hashed bins of their own, ``keys-000`` .. ``keys-1ff``, signed with the online
  key and listed in the snapshot; no device reads them (``epfleet.trust.device_keys``).
- Roles and keys: ``root`` (threshold of offline keys, default 2 of 3) and ``targets``
  (one offline key) are signed with keys kept in an offline directory; ``bin-*``,
  ``keys-*``, ``snapshot`` and ``timestamp`` with one online key given by a securesystemslib signer
  URI (``EPFLEET_TRUST_SIGNER``: ``file2:`` in development, a KMS in production), ECDSA
  P-256. Expiries: timestamp 1 day, snapshot and bins 7 days, key bins, targets and root 365 days.
"""
