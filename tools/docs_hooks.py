"""MkDocs hooks (mkdocs.yml ``hooks:``): the build fails when a generated reference page
(tools/docs_reference.py) no longer matches the code it was generated from."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

from mkdocs.exceptions import PluginError

sys.path.insert(0, str(Path(__file__).resolve().parent))

from docs_reference import stale_pages


def on_pre_build(config: Any) -> None:
    stale = stale_pages()
    if stale:
        raise PluginError(
            f"stale generated page(s): {', '.join(stale)}; run python tools/docs_reference.py"
        )
