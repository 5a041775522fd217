"""Signed stores for the attack suites: a small TUF writer (``Repo``, with ``Keys``) over a
copy of the compiled fleet, served from a local directory, S3 (moto) or a hostile HTTPS
mirror, and a device that trusts its root (``Fleet``); the checks that a sync refused what
it was served and kept what it ran."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path

import boto3
import pytest
from securesystemslib.signer import CryptoSigner
from tuf.api.metadata import (
    Delegations,
    Metadata,
    MetaFile,
    Root,
    Snapshot,
    SuccinctRoles,
    TargetFile,
    Targets,
    Timestamp,
)
from tuf.api.serialization.json import JSONSerializer

from epfleet.device.policy import SyncPolicy
from epfleet.device.session import sync
from epfleet.formats.device_report import DeviceReport, ModelReport
from epfleet.formats.manifest import Manifest
from epfleet.hashing import sha256_bytes
from epfleet.stores import open_store
from epfleet.trust.client import model_target, trust_dir
from tests.support.http_mirror import Mirror
from tests.support.synced_fleet import (
    assert_package_runs,
    rebuilt,
    republish_edited_cpu_variant,
)

MODEL = "tiny-cls"
DEVICE = "trusting-device"
SERIALIZER = JSONSerializer(compact=True)


def in_days(days: float) -> datetime:
    return datetime.now(timezone.utc).replace(microsecond=0) + timedelta(days=days)


def canonical(value: object) -> bytes:
    return json.dumps(value, sort_keys=True, separators=(",", ":")).encode()


@dataclass
class Keys:
    root: list[CryptoSigner] = field(
        default_factory=lambda: [CryptoSigner.generate_ecdsa() for _ in range(3)]
    )
    targets: CryptoSigner = field(default_factory=CryptoSigner.generate_ecdsa)
    online: CryptoSigner = field(default_factory=CryptoSigner.generate_ecdsa)


class Repo:
    """The signed metadata of a store directory, laid out as epfleet.trust says: root 2 of 3
    offline keys, targets one offline key, bins, snapshot and timestamp one online key;
    one target per model (its ok variants in the custom field ``epfleet``), consistent
    snapshots. Every ``publish`` is a new version of every role but root."""

    def __init__(self, store: Path, bins: int = 16) -> None:
        self.store, self.bins, self.keys = store, bins, Keys()
        self.meta = store / "trust" / "metadata"
        self.meta.mkdir(parents=True, exist_ok=True)
        self.version = 0
        self.root = Metadata(Root(expires=in_days(365), consistent_snapshot=True))
        for signer in self.keys.root:
            self.root.signed.add_key(signer.public_key, "root")
        self.root.signed.roles["root"].threshold = 2
        self.root.signed.add_key(self.keys.targets.public_key, "targets")
        for role in ("snapshot", "timestamp"):
            self.root.signed.add_key(self.keys.online.public_key, role)
        self.sign_root(self.keys.root[:2])
        self.publish()

    @property
    def root_file(self) -> Path:
        return self.meta / "1.root.json"

    def sign_root(self, signers: list[CryptoSigner]) -> None:
        self.root.signatures.clear()
        for signer in signers:
            self.root.sign(signer, append=True)
        (self.meta / f"{self.root.signed.version}.root.json").write_bytes(
            self.root.to_bytes(SERIALIZER)
        )

    def rotate_root(self, new: Keys, signers: list[CryptoSigner]) -> None:
        """Root version + 1 with ``new``'s keys for every role, signed by ``signers``."""
        signed = self.root.signed
        signed.version += 1
        for role in ("root", "targets", "snapshot", "timestamp"):
            for keyid in list(signed.roles[role].keyids):
                signed.revoke_key(keyid, role)
        for signer in new.root:
            signed.add_key(signer.public_key, "root")
        signed.add_key(new.targets.public_key, "targets")
        for role in ("snapshot", "timestamp"):
            signed.add_key(new.online.public_key, role)
        self.keys = new
        self.sign_root(signers)

    def rotate_online_key(self) -> CryptoSigner:
        """A new online key (root version + 1, signed by the root keys); returns the old."""
        old, self.keys.online = self.keys.online, CryptoSigner.generate_ecdsa()
        signed = self.root.signed
        signed.version += 1
        for role in ("snapshot", "timestamp"):
            signed.revoke_key(old.public_key.keyid, role)
            signed.add_key(self.keys.online.public_key, role)
        self.sign_root(self.keys.root[:2])
        return old

    def publish(
        self, *, timestamp_expires: datetime | None = None, online: CryptoSigner | None = None
    ) -> int:
        """Sign the store's manifest.json as version + 1 of targets, bins, snapshot and
        timestamp (with ``online`` standing in for the online key: a wrong key)."""
        online = online or self.keys.online
        self.version += 1
        version = self.version
        document = json.loads((self.store / "manifest.json").read_bytes())
        bits = (self.bins - 1).bit_length()
        succinct = SuccinctRoles([online.public_key.keyid], 1, bits, "bin")
        targets = Targets(version=version, expires=in_days(365))
        keys = {online.public_key.keyid: online.public_key}
        targets.delegations = Delegations(keys=keys, succinct_roles=succinct)
        bins = {name: Targets(version=version, expires=in_days(7)) for name in succinct.get_roles()}
        declared = document.get("schema_version", "1.0")
        schema = {} if declared == "1.0" else {"epfleet_schema": declared}
        for name, entry in document["models"].items():
            variants = entry["variants"]
            entry["variants"] = {t: v for t, v in variants.items() if v["status"] == "ok"}
            target = self.target(model_target(name), canonical(entry))
            # Canonical JSON has no floats: the entry goes as its JSON text (beside the
            # manifest's schema version, unless it is 1.0).
            custom = {"epfleet": canonical(entry).decode(), **schema}
            target.unrecognized_fields["custom"] = custom
            bins[succinct.get_role_for_target(target.path)].targets[target.path] = target
        whole = (self.store / "manifest.json").read_bytes()
        targets.targets["manifest.json"] = self.target("manifest.json", whole)
        snapshot = Snapshot(version=version, expires=in_days(7))
        for name, role in [*bins.items(), ("targets", targets)]:
            signer = self.keys.targets if name == "targets" else online
            raw = self.write(f"{version}.{name}.json", role, signer)
            snapshot.meta[f"{name}.json"] = MetaFile(version, length=len(raw))
        raw = self.write(f"{version}.snapshot.json", snapshot, online)
        expires = timestamp_expires or in_days(1)
        stamp = Timestamp(
            version=version, expires=expires, snapshot_meta=MetaFile(version, length=len(raw))
        )
        self.write("timestamp.json", stamp, online)
        return version

    def target(self, path: str, data: bytes) -> TargetFile:
        target = TargetFile.from_data(path, data, ["sha256"])
        folder, _, name = path.rpartition("/")
        stored = self.store / "trust" / "targets" / folder / f"{target.hashes['sha256']}.{name}"
        stored.parent.mkdir(parents=True, exist_ok=True)
        stored.write_bytes(data)
        return target

    def write(
        self, name: str, signed: Root | Targets | Snapshot | Timestamp, signer: CryptoSigner
    ) -> bytes:
        metadata = Metadata(signed)
        metadata.sign(signer)
        raw = metadata.to_bytes(SERIALIZER)
        (self.meta / name).write_bytes(raw)
        return raw

    def bin_of(self, model: str) -> str:
        bits = (self.bins - 1).bit_length()
        return SuccinctRoles([], 1, bits, "bin").get_role_for_target(model_target(model))


@dataclass
class Site:
    """The publisher's working copy of a store (``directory``) and where devices read it
    (``uri``); ``push`` makes the store what the directory holds."""

    directory: Path
    uri: str
    push: Callable[[], None]
    origin: str = ""
    """Where publishers write (the store behind a read-only mirror); default ``uri``."""

    @property
    def publish_uri(self) -> str:
        return self.origin or self.uri


def s3_mirror(directory: Path, bucket: str, prefix: str = "fleet") -> Callable[[], None]:
    s3 = boto3.client("s3", region_name="us-east-1")
    sent: dict[str, str] = {}

    def push() -> None:
        present = {}
        for path in sorted(directory.rglob("*")):
            if path.is_file() and not path.name.startswith("."):
                key = f"{prefix}/{path.relative_to(directory).as_posix()}"
                present[key] = digest = sha256_bytes(path.read_bytes())
                if sent.get(key) != digest:
                    s3.upload_file(str(path), bucket, key)
        for key in set(sent) - set(present):
            s3.delete_object(Bucket=bucket, Key=key)
        sent.clear()
        sent.update(present)

    return push


def mirror_site(request: pytest.FixtureRequest, directory: Path) -> Site:
    """The store served read-only over HTTP by a hostile mirror (tests/support/http_mirror.py):
    devices hold no credentials and trust only the signed metadata."""
    served = Mirror(directory)
    request.addfinalizer(served.close)
    return Site(directory, served.url, lambda: None, origin=str(directory))


def s3_site(request: pytest.FixtureRequest, directory: Path) -> Site:
    bucket = request.getfixturevalue("s3_bucket")
    request.getfixturevalue("s3_proxy")  # stores opened from here on go through it
    push = s3_mirror(directory, bucket)
    return Site(directory, f"s3://{bucket}/fleet", push)


@dataclass
class Fleet:
    site: Site
    repo: Repo
    root: Path
    cache: Path

    def sync(self, trust_root: Path | None = None) -> DeviceReport:
        root = trust_root or self.root
        return sync(self.site.uri, self.cache, SyncPolicy(models=[MODEL]), DEVICE, trust_root=root)

    def republish(self) -> None:
        """A new, genuine build of tiny-cls's CPU variant, signed."""
        republish_edited_cpu_variant(self.site.directory, rebuilt)
        self.repo.publish()
        self.site.push()


def trusted(site: Site, tmp_path: Path) -> Fleet:
    repo = Repo(site.directory)
    root = tmp_path / "root.json"
    shutil.copy(repo.root_file, root)
    site.push()
    return Fleet(site, repo, root, tmp_path / "device")


def trust_of(cache: Path, store_uri: str) -> Path:
    """The cache's trust directory for the store at ``store_uri``."""
    return trust_dir(cache / ".epfleet", open_store(store_uri).uri)


def only(report: DeviceReport) -> ModelReport:
    [found] = report.models
    return found


def assert_refused(report: DeviceReport, kept: ModelReport, *words: str) -> None:
    """The sync failed on the signed metadata, said why, and still runs what it ran."""
    assert report.exit_code == 1
    assert report.manifest.status == "rejected" and report.manifest.signed
    reason = report.manifest.reason or ""
    assert all(w in reason for w in words), reason
    assert only(report).variant == kept.variant, only(report).reason
    assert only(report).action == "kept"
    assert_package_runs(report_cache(report), {MODEL: kept.variant or ""})


def report_cache(report: DeviceReport) -> Path:
    return Path(report.cache)


def first_sync(fleet: Fleet) -> ModelReport:
    report = fleet.sync()
    assert report.exit_code == 0 and report.manifest.signed, report.manifest
    good = only(report)
    assert good.action == "downloaded", good.reason
    return good


def synthetic_store(directory: Path, models: int) -> Path:
    """A store whose manifest lists ``models`` models with a source each and no variants."""
    entries = {
        f"model-{i:03d}": {
            "source": {"uri": f"sources/{i}.onnx", "sha256": sha256_bytes(b"%d" % i), "size": 1}
        }
        for i in range(models)
    }
    directory.mkdir(parents=True)
    (directory / "manifest.json").write_bytes(
        Manifest.model_validate({"models": entries}).to_json()
    )
    return directory
