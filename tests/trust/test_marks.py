"""The device's trust state without a compiled fleet: the high-water mark's rules
(``epfleet.trust.highwater``), cached roots judged and replaced (``epfleet.trust.roots``),
and ``verify`` held to a mark over a small signed store (tests/support/signed_fleet.py's
``Repo``), with a write failure injected where the trust directory is written.

The injected failures stand in for a full disk, a quota or an I/O error at the one
primitive every trust-directory write goes through (``atomic_write_bytes`` in
``epfleet.trust.updater``): tests/device/test_full_disk.py fills a real filesystem where it can
mount one.
"""

from __future__ import annotations

import errno
import json
import shutil
from pathlib import Path

import pytest

from epfleet.errors import BadInputError, CacheNotWritable, DiskFull, MetadataRefused
from epfleet.stores import open_store
from epfleet.trust.client import verify
from epfleet.trust.highwater import (
    TrustMark,
    advanced,
    below,
    generation_below,
    lineage,
    with_generation,
)
from epfleet.trust.roots import examine, provisioned_root, signed_sha256
from tests.support.signed_fleet import Keys, Repo, synthetic_store

pytestmark = pytest.mark.fast

WANTED = ["model-001"]


# --- the mark's rules ------------------------------------------------------------------------


def test_lineage_tells_the_same_repository_a_new_one_and_a_fork() -> None:
    mark = TrustMark(roots={1: "a", 2: "b"}, timestamp=5, snapshot=5)
    assert lineage(mark, {1: "a", 2: "b", 3: "c"}) == "same"  # a rotation followed
    assert lineage(mark, {2: "b"}) == "same"
    assert lineage(mark, {4: "d"}) == "same"  # nothing to compare: the mark applies
    assert lineage(mark, {1: "x"}) == "new"  # provisioned with another repository's root
    assert lineage(mark, {2: "x", 3: "c"}) == "new"
    assert lineage(mark, {1: "a", 2: "x"}) == "forked"  # retired keys signed another root 2


def test_the_mark_refuses_older_versions_and_only_ever_rises() -> None:
    mark = TrustMark(roots={1: "a", 2: "b"}, timestamp=5, snapshot=4, generation=7)
    assert below(mark, "timestamp", 5) is None and below(mark, "snapshot", 9) is None
    assert below(mark, "timestamp", 4) == (
        "timestamp version 4, older than version 5 which this device accepted"
    )
    assert below(mark, "root", 1) is not None and below(mark, "root", 2) is None
    assert generation_below(mark, 6) is not None and generation_below(mark, 7) is None
    assert generation_below(TrustMark(), 1) is None

    risen = advanced(mark, {2: "b", 3: "c"}, timestamp=3, snapshot=6)
    assert risen == TrustMark(roots={1: "a", 2: "b", 3: "c"}, timestamp=5, snapshot=6, generation=7)
    assert with_generation(risen, 3).generation == 7
    assert with_generation(risen, 9).generation == 9
    assert advanced(None, {1: "z"}, 1, 1) == TrustMark(roots={1: "z"}, timestamp=1, snapshot=1)


# --- cached roots ---------------------------------------------------------------------------


def corrupt_signatures(data: bytes) -> bytes:
    document = json.loads(data)
    for signature in document["signatures"]:
        signature["sig"] = "00" * 64
    return json.dumps(document).encode()


@pytest.fixture
def repo(tmp_path: Path) -> Repo:
    return Repo(synthetic_store(tmp_path / "store", 3))


def trust_with(tmp_path: Path, roots: dict[int, bytes]) -> Path:
    """A trust directory whose root history holds ``roots``."""
    directory = tmp_path / "cache" / ".epfleet" / "trust" / "0123456789abcdef"
    history = directory / "root_history"
    history.mkdir(parents=True)
    for version, data in roots.items():
        (history / f"{version}.root.json").write_bytes(data)
    return directory


def test_a_cached_root_is_intact_only_when_it_verifies_itself(repo: Repo) -> None:
    data = repo.root_file.read_bytes()
    assert examine(data, 1) is None
    assert "not root metadata" in (examine(data[:100], 1) or "")
    assert "signatures do not verify" in (examine(corrupt_signatures(data), 1) or "")
    assert examine(data, 2) == "holds root version 1, not 2"
    # The record is of the signed part: the same for any copy, whatever its formatting.
    pretty = json.dumps(json.loads(data), indent=4).encode()
    assert signed_sha256(pretty) == signed_sha256(data) == signed_sha256(corrupt_signatures(data))


def test_a_damaged_newest_root_starts_from_an_older_intact_one(repo: Repo, tmp_path: Path) -> None:
    first = repo.root_file.read_bytes()
    old, new = repo.keys, Keys()
    repo.rotate_root(new, [*old.root[:2], *new.root[:2]])
    second = (repo.meta / "2.root.json").read_bytes()
    directory = trust_with(tmp_path, {1: first, 2: corrupt_signatures(second)})

    start = provisioned_root(directory, None, None)

    assert start.root == first and start.damaged is None
    assert "2.root.json is damaged" in (start.note or "")
    assert "started from the intact root version 1" in (start.note or "")


def test_a_damaged_only_root_says_so_and_takes_only_the_root_it_recorded(
    repo: Repo, tmp_path: Path
) -> None:
    genuine = repo.root_file.read_bytes()
    directory = trust_with(tmp_path, {1: corrupt_signatures(genuine)})
    given = tmp_path / "root.json"
    given.write_bytes(genuine)
    recorded = TrustMark(roots={1: signed_sha256(genuine) or ""}, timestamp=1, snapshot=1)

    refused = provisioned_root(directory, None, recorded)
    assert refused.root is None and refused.damaged is not None
    assert str(directory / "root_history" / "1.root.json") in refused.damaged
    assert "--trust-root" in refused.damaged

    healed = provisioned_root(directory, given, recorded)
    assert healed.root == genuine and "replaced from --trust-root" in (healed.note or "")

    other = tmp_path / "other.json"
    other.write_bytes(Repo(synthetic_store(tmp_path / "elsewhere", 3)).root_file.read_bytes())
    with pytest.raises(BadInputError, match="cannot be shown to be the root this device"):
        provisioned_root(directory, other, recorded)
    with pytest.raises(BadInputError, match="cannot be shown"):  # no record: nothing shows it
        provisioned_root(directory, given, None)


def test_a_given_root_replaces_a_damaged_one_when_the_intact_root_before_it_signed_it(
    repo: Repo, tmp_path: Path
) -> None:
    first = repo.root_file.read_bytes()
    old, new = repo.keys, Keys()
    repo.rotate_root(new, [*old.root[:2], *new.root[:2]])
    second = (repo.meta / "2.root.json").read_bytes()
    directory = trust_with(tmp_path, {1: first, 2: corrupt_signatures(second)})
    given = tmp_path / "2.root.json"
    given.write_bytes(second)

    start = provisioned_root(directory, given, TrustMark(roots={1: signed_sha256(first) or ""}))

    assert start.root == second
    assert "signed by the intact cached root version 1" in (start.note or "")


def test_a_given_root_is_checked_before_anything_is_trusted(repo: Repo, tmp_path: Path) -> None:
    directory = trust_with(tmp_path, {1: repo.root_file.read_bytes()})
    broken = tmp_path / "broken.json"
    broken.write_bytes(b"{}")
    with pytest.raises(BadInputError, match="is not valid TUF root metadata"):
        provisioned_root(directory, broken, None)
    other = tmp_path / "other.json"
    other.write_bytes(Repo(synthetic_store(tmp_path / "elsewhere", 3)).root_file.read_bytes())
    with pytest.raises(BadInputError, match="not the root this device already trusts"):
        provisioned_root(directory, other, None)


# --- verify held to the mark ----------------------------------------------------------------


def test_verify_refuses_a_set_older_than_the_mark_once_the_trust_cache_is_emptied(
    repo: Repo, tmp_path: Path
) -> None:
    store, trust = open_store(str(repo.store)), tmp_path / "trust"
    trust.mkdir()
    root = repo.root_file.read_bytes()
    first = verify(store, trust, root, WANTED)
    old = (repo.meta / "timestamp.json").read_bytes()
    repo.publish()
    second = verify(store, trust, root, WANTED, first.mark)
    assert (second.mark.timestamp, second.mark.snapshot) == (2, 2)
    assert second.mark.roots == {1: signed_sha256(root)} and second.lineage == "same"
    for name in ("timestamp.json", "snapshot.json"):
        (trust / name).write_bytes(b"")
    (repo.meta / "timestamp.json").write_bytes(old)

    with pytest.raises(MetadataRefused, match="a rollback: the store serves timestamp version 1"):
        verify(store, trust, root, WANTED, second.mark)

    assert (trust / "timestamp.json").read_bytes() == b""  # never written
    assert verify(store, trust, root, WANTED).version == 1  # without the mark: what it was


def test_a_write_failure_in_the_trust_directory_is_one_clear_error(
    repo: Repo, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store, root = open_store(str(repo.store)), repo.root_file.read_bytes()
    for code, kind, words in [
        (errno.ENOSPC, DiskFull, "no disk space to write"),
        (errno.EDQUOT, DiskFull, "no disk space to write"),
        (errno.EACCES, CacheNotWritable, "must be writable by this user"),
        (errno.EIO, CacheNotWritable, "cannot write"),
    ]:

        def failing(path: Path, data: bytes, code: int = code) -> None:
            raise OSError(code, errno.errorcode[code], str(path))

        monkeypatch.setattr("epfleet.trust.updater.atomic_write_bytes", failing)
        trust = tmp_path / f"trust-{code}"
        trust.mkdir()
        with pytest.raises(kind, match=words) as raised:
            verify(store, trust, root, WANTED)
        assert str(trust / "root_history" / "1.root.json") in str(raised.value)
        shutil.rmtree(trust)
