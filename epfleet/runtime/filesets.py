"""Multi-file models on disk: which files make a source, and laying a file set into a directory.

A source is an ONNX file, with the external data files its tensors name beside it, or a
folder (a GenAI-style model folder): every regular, non-hidden file under it, its main
ONNX file named by the spec's ``model_file``. Paths inside a set are relative POSIX
paths that fit ``FILE_PATH_PATTERN``; external data never leaves its files here (only
the main file's graph is read, without its weights). A set's files are read only as
regular files in the model's folder (``open_in_set``): a file that is a symbolic link, or
lies in a linked directory, could put any file of the host into the store.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path, PurePosixPath
from typing import BinaryIO

from onnx import ModelProto, external_data_helper

from epfleet.errors import BadInputError
from epfleet.formats.manifest import FILE_PATH_MAX_LENGTH, FILE_PATH_PATTERN, MODEL_FILE
from epfleet.fsutil import NotRegularFile, open_nofollow
from epfleet.hashing import sha256_stream

_PATH = re.compile(FILE_PATH_PATTERN)


@dataclass(frozen=True)
class LocalSet:
    """A source's files on disk: ``root / model_file`` is the main ONNX file and each of
    ``others`` (relative POSIX paths) lies at ``root / path``; ``names`` maps a path in the
    set to its file's name on disk when they differ (a single file's main is renamed)."""

    root: Path
    model_file: str
    others: list[str] = field(default_factory=list)
    disk_names: dict[str, str] = field(default_factory=dict)

    def path_of(self, path: str) -> Path:
        return self.root / self.disk_names.get(path, path)


def external_tensors(model: ModelProto) -> list:
    """The model's tensors (initializers, node attributes, subgraphs' too) whose data is in
    an external file."""
    return [
        tensor
        for tensor in external_data_helper._get_all_tensors(model)
        if external_data_helper.uses_external_data(tensor)
    ]


def external_locations(model: ModelProto) -> list[str]:
    """The files the model's external tensors name (``location``), as given, sorted."""
    found = set()
    for tensor in external_tensors(model):
        for entry in tensor.external_data:
            if entry.key == "location":
                found.add(entry.value)
    return sorted(found)


def check_location(location: str, where: str) -> str:
    """``location`` as a path in the set: relative, inside the model's directory."""
    posix = location.replace("\\", "/")
    parts = PurePosixPath(posix).parts
    if posix.startswith("/") or ".." in parts or not parts:
        raise BadInputError(
            f"{where}: external data location {location!r} is not inside its folder"
        )
    return "/".join(p for p in parts if p != ".")


def check_paths(paths: list[str], where: str) -> None:
    """BadInputError naming the paths a device cannot take (hidden, odd characters, too long)."""
    bad = [p for p in paths if not _PATH.match(p) or len(p) > FILE_PATH_MAX_LENGTH]
    if bad:
        raise BadInputError(
            f"{where}: file names must be letters, digits and _.+- (not starting with '.' or "
            f"'-'), at most {FILE_PATH_MAX_LENGTH} characters: {', '.join(sorted(bad))}"
        )


def folder_files(root: Path, where: str) -> list[str]:
    """Every regular, non-hidden file under ``root``, as sorted relative POSIX paths.
    Refuses symbolic links that lead outside ``root`` and linked directories."""
    real_root = root.resolve()
    found = []
    for parent, dirs, files in os.walk(root):
        dirs[:] = sorted(d for d in dirs if not d.startswith("."))
        for name in [d for d in dirs if os.path.islink(os.path.join(parent, d))]:
            raise BadInputError(
                f"{where}: {Path(parent, name)} is a linked directory; copy it into the folder"
            )
        for name in sorted(files):
            if name.startswith("."):
                continue
            path = Path(parent, name)
            if path.is_symlink():
                target = path.resolve()
                if not target.is_relative_to(real_root):
                    raise BadInputError(
                        f"{where}: {path} is a symbolic link to {target}, outside the folder"
                    )
            if not path.is_file():
                continue  # a socket, a fifo, a dangling link
            found.append(path.relative_to(root).as_posix())
    return sorted(found)


def choose_model_file(files: list[str], model_file: str | None, where: str) -> str:
    """The folder's main ONNX file: the spec's ``model_file``, else ``model.onnx``, else its
    only ``.onnx`` file. It must lie in the folder itself (its directory is the variant's)."""
    if model_file is not None:
        if model_file not in files:
            raise BadInputError(f"{where}: model_file {model_file!r} is not in the folder")
        chosen = model_file
    elif MODEL_FILE in files:
        chosen = MODEL_FILE
    else:
        candidates = [f for f in files if f.lower().endswith(".onnx")]
        if len(candidates) != 1:
            listed = ", ".join(candidates) or "none"
            raise BadInputError(
                f"{where}: the folder has no model.onnx and {len(candidates)} .onnx files "
                f"({listed}); name the main one in model_file"
            )
        chosen = candidates[0]
    if "/" in chosen:
        raise BadInputError(
            f"{where}: model_file {chosen!r} must lie in the folder itself, not in a subfolder"
        )
    return chosen


def file_set(path: Path, model: ModelProto | None, model_file: str | None, where: str) -> LocalSet:
    """The files that make the source at ``path`` (a file or a folder), checked. ``model``
    is the main file's graph (for a file source: to find its external data files)."""
    if path.is_dir():
        files = folder_files(path, where)
        main = choose_model_file(files, model_file, where)
        found = LocalSet(root=path, model_file=main, others=[f for f in files if f != main])
        check_paths(files, where)
        return found
    if model_file is not None:
        raise BadInputError(f"{where}: model_file is for a folder source; {path} is a file")
    if model is None:
        return LocalSet(root=path.parent, model_file=MODEL_FILE, disk_names={MODEL_FILE: path.name})
    others = sorted({check_location(loc, where) for loc in external_locations(model)})
    check_paths(others, where)
    return LocalSet(
        root=path.parent,
        model_file=MODEL_FILE,
        others=others,
        disk_names={MODEL_FILE: path.name},
    )


@contextmanager
def open_in_set(files: LocalSet, path: str, where: str) -> Iterator[BinaryIO]:
    """The set's file at ``path``, open for reading: it must be a regular file, not a
    symbolic link (opened without following one), in a directory that resolves inside the
    set's folder. BadInputError naming the file otherwise."""
    local = files.path_of(path)
    folder = files.root.resolve()
    if not local.parent.resolve().is_relative_to(folder):
        raise BadInputError(
            f"{where}: {path} lies in {local.parent.resolve()}, outside the model's folder "
            f"{folder} (through a linked directory); copy the file into the folder"
        )
    try:
        with open_nofollow(local) as file:
            yield file
    except NotRegularFile:
        kind = "a symbolic link" if local.is_symlink() else "not a regular file"
        raise BadInputError(
            f"{where}: {local} is {kind}; a source's files are read only as regular files "
            "in the model's folder: copy the file itself there"
        ) from None
    except FileNotFoundError:
        raise BadInputError(f"{where}: {local} does not exist") from None


def hash_in_set(files: LocalSet, path: str, where: str) -> tuple[str, int]:
    """(sha256, size) of the set's file at ``path``, opened as ``open_in_set`` does."""
    with open_in_set(files, path, where) as file:
        return sha256_stream(file)


def check_external_data(files: LocalSet, model: ModelProto, where: str) -> list[str]:
    """The set's paths that are the main model's external data; BadInputError naming the
    files its tensors name that are missing."""
    locations = [check_location(loc, where) for loc in external_locations(model)]
    present = set(files.others)
    missing = sorted(
        {loc for loc in locations if loc not in present or not files.path_of(loc).is_file()}
    )
    if missing:
        raise BadInputError(f"{where}: external data files are missing: {', '.join(missing)}")
    return sorted(set(locations))


def link_or_copy(src: Path, dst: Path) -> None:
    """Put ``src`` at ``dst`` (its directories made): a hard link, or a copy across
    filesystems. The file is never read into memory."""
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)


def listed_files(directory: Path, but: str) -> list[str]:
    """Every file under ``directory`` but ``but``, as sorted relative POSIX paths."""
    found = []
    for parent, _, files in os.walk(directory):
        for name in files:
            path = Path(parent, name).relative_to(directory).as_posix()
            if path != but:
                found.append(path)
    return sorted(found)
