"""Where private keys may be written: never where a ``git add`` would publish them.

The rule: a keys directory inside a git work tree is refused unless git ignores it (what
``git check-ignore`` says of a file in it), or the operator says ``--force``. A work tree
is found by its ``.git`` (a directory, or a file for a linked work tree or submodule) in
the directory or a parent. When git itself cannot be run, nothing tells whether the
directory is ignored, and it is refused too.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from epfleet.errors import BadInputError

_PROBE = "root-1.pem"
"""A file name the directory will hold, asked about (the directory may not exist yet)."""


def enclosing_work_tree(directory: Path) -> Path | None:
    """The top of the git work tree ``directory`` is in, or None."""
    for candidate in [directory, *directory.parents]:
        if (candidate / ".git").exists():
            return candidate
    return None


def check_keys_location(directory: Path, *, force: bool = False) -> None:
    """BadInputError when private keys written to ``directory`` could be committed (see
    the module's rule)."""
    directory = Path(directory).absolute()
    tree = enclosing_work_tree(directory)
    if tree is None or force:
        return
    git = shutil.which("git")
    ignored = None
    if git is not None:
        probe = directory / _PROBE
        done = subprocess.run(
            [git, "-C", str(tree), "check-ignore", "-q", str(probe.relative_to(tree))],
            capture_output=True,
            check=False,
        )
        ignored = {0: True, 1: False}.get(done.returncode)
    if ignored:
        return
    why = (
        "git does not ignore it" if ignored is False else "git could not say whether it is ignored"
    )
    raise BadInputError(
        f"--keys {directory} is inside the git work tree {tree} and {why}: private keys "
        f"there are one `git add .` from being published. Keep them outside the work tree "
        f"(e.g. --keys ~/fleet-keys, or removable media), or add "
        f"{directory.relative_to(tree).as_posix()}/ to {tree / '.gitignore'}, or give --force"
    )
