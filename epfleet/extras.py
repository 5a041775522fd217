"""The parts of epfleet that are pip extras, and the error that names the one to install.

``pip install epfleet`` is the device install: ``epfleet sync``, the manifest, local and
``https://`` stores, signed metadata (python-tuf), ONNX Runtime for the CPU. Each extra
adds one part (``pyproject.toml``)::

    host      the compile host: Prefect and the flows (epfleet compile, watch, serve,
              sync --flow), fleet specs in YAML (compile, retire)
    s3        s3:// stores (boto3)
    dask      the fleet flow's Dask task runner (with host)
    oms       OpenSSF model signatures
    qnn, openvino, trt-rtx
              an execution provider's plugin (its module in ``eps`` names it)

Code of an extra imports its packages where it runs, never at the top of a module the
device install loads, so a missing package is found when a command needs it:
``missing_extra`` turns that ``ModuleNotFoundError`` into a ``MissingExtraError`` naming
the extra, as a store backend (``epfleet.stores.open_store``) and the command line
(``epfleet.cli.app.main``) do.
"""

from __future__ import annotations

from epfleet.errors import MissingExtraError

EXTRA_OF: dict[str, str] = {
    "prefect": "host",
    "yaml": "host",
    "boto3": "s3",
    "botocore": "s3",
    "prefect_dask": "dask",
    "dask": "dask",
    "distributed": "dask",
    "model_signing": "oms",
    "OpenSSL": "oms",
}
"""The top-level import name of each extra's package and the extra it comes with."""


def install_command(extra: str) -> str:
    return f'pip install "epfleet[{extra}]"'


def missing_extra(exc: ModuleNotFoundError, what: str) -> MissingExtraError | None:
    """The error to raise for ``exc`` when ``what`` (a command, a store) needs an extra this
    install lacks; None when the missing module is no extra's (a broken install)."""
    package = (exc.name or "").partition(".")[0]
    extra = EXTRA_OF.get(package)
    if extra is None:
        return None
    return MissingExtraError(
        f"{what} needs epfleet's {extra!r} extra, which this install does not have "
        f"(no {package} module): {install_command(extra)}"
    )
