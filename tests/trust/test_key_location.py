"""``epfleet trust init`` keeps private keys out of git work trees and is all or nothing
(epfleet.trust.key_location, epfleet.trust.creation.init_with_key_files), through
``epfleet.cli.app.main``. The work trees are real git repositories, written by hand (a
``.git`` with HEAD, objects and refs is one to git), asked by the real ``git``."""

from __future__ import annotations

from pathlib import Path

import pytest

from epfleet.cli.app import main
from epfleet.errors import StoreError
from epfleet.stores import open_store
from epfleet.trust.key_location import check_keys_location
from epfleet.trust.repository import init_with_key_files

pytestmark = pytest.mark.fast


def work_tree(root: Path, ignore: str = "") -> Path:
    (root / ".git" / "objects").mkdir(parents=True)
    (root / ".git" / "refs").mkdir()
    (root / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (root / ".gitignore").write_text(ignore)
    return root


def init(
    capsys: pytest.CaptureFixture[str], store: Path, keys: Path, *more: str
) -> tuple[int, str]:
    code = main(
        ["trust", "init", "--store", str(store), "--keys", str(keys), "--bins", "16", *more]
    )
    out, err = capsys.readouterr()
    return code, out + err


def test_keys_in_a_work_tree_that_does_not_ignore_them_are_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clone = work_tree(tmp_path / "clone", ignore="*.dev-keys/\n")
    code, said = init(capsys, tmp_path / "store", clone / "fleet-keys")
    assert code == 2
    assert "inside the git work tree" in said and "git does not ignore it" in said
    assert "fleet-keys/" in said and "--force" in said
    assert not (clone / "fleet-keys").exists()
    assert not (tmp_path / "store" / "trust").exists()  # refused before the store is touched


def test_keys_git_ignores_or_outside_any_work_tree_or_forced_are_written(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    clone = work_tree(tmp_path / "clone", ignore="fleet-keys/\n")
    assert init(capsys, tmp_path / "a", clone / "fleet-keys")[0] == 0
    assert (clone / "fleet-keys" / "root-1.pem").is_file()
    assert init(capsys, tmp_path / "b", tmp_path / "elsewhere" / "keys")[0] == 0
    code, _ = init(capsys, tmp_path / "c", clone / "other-keys", "--force")
    assert code == 0 and (clone / "other-keys" / "targets.pem").is_file()


def test_a_directory_nested_in_an_ignored_one_is_ignored_too(tmp_path: Path) -> None:
    clone = work_tree(tmp_path / "clone", ignore="secrets/\n")
    check_keys_location(clone / "secrets" / "fleet" / "keys")
    with pytest.raises(Exception, match="git does not ignore it"):
        check_keys_location(clone / "public" / "keys")


def test_a_failed_init_leaves_no_key_and_can_be_run_again(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    store = tmp_path / "store"
    store.mkdir()
    (store / "manifest.json").write_text("{not json")  # init refuses to sign it
    keys = tmp_path / "keys"
    with pytest.raises(StoreError):
        init_with_key_files(open_store(str(store)), keys, bins=16)
    assert not keys.exists()
    assert [p.name for p in tmp_path.iterdir() if p.name.startswith(".")] == []  # no staging
    (store / "manifest.json").unlink()
    code, said = init(capsys, store, keys)
    assert code == 0, said
    assert sorted(p.name for p in keys.iterdir()) == [
        "online.pem",
        "root-1.pem",
        "root-2.pem",
        "root-3.pem",
        "root.json",
        "targets.pem",
    ]
    assert f"file2:{keys / 'online.pem'}" in said  # the signer URI names the key's final place
    assert (keys / "root-1.pem").stat().st_mode & 0o777 == 0o600


def test_an_existing_directory_without_keys_receives_them_and_keeps_its_files(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    keys = tmp_path / "keys"
    keys.mkdir()
    (keys / "README").write_text("offline keys of the fleet")
    assert init(capsys, tmp_path / "store", keys)[0] == 0
    assert (keys / "README").read_text() == "offline keys of the fleet"
    assert (keys / "root.json").is_file()
    code, said = init(capsys, tmp_path / "store2", keys)
    assert code == 2 and "already holds keys" in said
