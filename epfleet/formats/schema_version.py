"""The manifest's forward-compatibility policy (pure): what a ``schema_version`` of
"MAJOR.MINOR" lets a reader or a writer of this epfleet do, and the tolerant validation
that ignores the fields a newer minor added.

A minor bump only adds fields an older reader may safely ignore; anything an older
device must not ignore (a field that restricts what it may install, a changed meaning)
bumps the major. Readers (devices, ``manifest show``, watch) accept the major they know
with any minor: when a document declares a newer minor, they drop the keys they do not
know; at their own minor or an older one an unknown key stays an error (a typo or
tampering in a document they fully understand). A newer major is refused. Writers
(anything that reads the manifest and then writes or deletes by it) refuse a newer minor
or major: writing what they read would silently drop what they do not know.

Unknown keys are found by strict validation itself (its ``extra_forbidden`` errors name
each one's place), so the strict fast path carries no extra validator; only a document
that fails it is parsed again.
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any, Literal, TypeVar

from pydantic import BaseModel, ValidationError
from pydantic_core import InitErrorDetails, PydanticCustomError

from epfleet.errors import BadInputError

SCHEMA_VERSION = "1.8"
"""What this epfleet writes, and the newest version it fully understands."""
VERSION_PATTERN = r"^[0-9]+\.[0-9]+$"
NEWER_MINOR = "newer_minor"
"""The validation context's key: "ignore" (a reader) or "refuse" (a writer, the default)."""

NewerMinor = Literal["refuse", "ignore"]
M = TypeVar("M", bound=BaseModel)
_PASSES = 8
"""Strict validation reports every unknown key at once; a few passes bound the odd case."""


def _parts(version: str) -> tuple[int, int] | None:
    if not re.fullmatch(VERSION_PATTERN, version):
        return None
    major, minor = version.split(".")
    return int(major), int(minor)


KNOWN = _parts(SCHEMA_VERSION) or (1, 0)


def is_newer_minor(version: object) -> bool:
    """Same major as this epfleet's, newer minor: a reader may ignore its unknown keys."""
    parts = _parts(version) if isinstance(version, str) else None
    return parts is not None and parts[0] == KNOWN[0] and parts[1] > KNOWN[1]


def refusal(version: str, newer_minor: NewerMinor) -> str | None:
    """Why a document declaring ``version`` is refused (None: it is not): by a reader
    (``newer_minor="ignore"``) only for a newer major; by a writer for anything newer."""
    parts = _parts(version)
    if parts is None or parts <= KNOWN:
        return None
    if newer_minor == "refuse":
        return (
            f"the manifest declares schema {version}, newer than this epfleet writes "
            f"({SCHEMA_VERSION}): upgrade epfleet on the compile host; nothing was written "
            "(writing it with this one would drop what it does not know)"
        )
    if parts[0] > KNOWN[0]:
        return (
            f"the manifest declares schema {version}, newer than this epfleet reads "
            f"({KNOWN[0]}.x): update epfleet on this device; the manifest in force stays"
        )
    return None


def version_error(version: str, newer_minor: NewerMinor) -> PydanticCustomError | None:
    """``refusal`` as the error a validator raises (its message, unprefixed)."""
    reason = refusal(version, newer_minor)
    return None if reason is None else PydanticCustomError("schema_version_newer", reason)


def mode(context: object) -> NewerMinor:
    """The validation context's newer-minor mode ("refuse" when none is given)."""
    wanted = context.get(NEWER_MINOR) if isinstance(context, dict) else None
    return "ignore" if wanted == "ignore" else "refuse"


def validate_json(
    cls: type[M], data: bytes | str, newer_minor: NewerMinor, declared: str | None = None
) -> M:
    """``cls`` validated from JSON: strict first; only when that fails on unknown keys and
    the document (or ``declared``, the version it comes with) is a newer minor a reader
    may ignore, parsed and validated again without them. ValidationError otherwise."""
    context = {NEWER_MINOR: newer_minor}
    try:
        return cls.model_validate_json(data, context=context)
    except ValidationError as exc:
        if newer_minor != "ignore" or not _unknown_keys(exc):
            raise
        try:
            document = json.loads(data)
        except ValueError:
            raise exc from None
        return _without_unknown(cls, document, exc, declared, context)


def validate_python(
    cls: type[M], value: object, newer_minor: NewerMinor, declared: str | None = None
) -> M:
    """``validate_json`` for a value already parsed (a ``json.loads`` result)."""
    context = {NEWER_MINOR: newer_minor}
    try:
        return cls.model_validate(value, context=context)
    except ValidationError as exc:
        if newer_minor != "ignore" or not _unknown_keys(exc):
            raise
        return _without_unknown(cls, copy.deepcopy(value), exc, declared, context)


def check_declared(cls: type[BaseModel], declared: str, newer_minor: NewerMinor) -> None:
    """ValidationError (at ``schema_version``) when the version a document comes with,
    outside it (a signed entry's), is refused."""
    error = version_error(declared, newer_minor)
    if error is not None:
        details = InitErrorDetails(type=error, loc=("schema_version",), input=declared)
        raise ValidationError.from_exception_data(cls.__name__, [details])


def check_writable(version: str | None, where: str) -> None:
    """BadInputError when a document declaring ``version`` (read as a reader reads it:
    the keys of a newer minor dropped) is in force at ``where``: a writer must not write
    or delete by it. None: there is no document yet."""
    reason = refusal(version, "refuse") if version is not None else None
    if reason is not None:
        raise BadInputError(f"{where}: {reason}")


def _unknown_keys(exc: ValidationError) -> list[tuple[int | str, ...]]:
    return [e["loc"] for e in exc.errors() if e["type"] == "extra_forbidden"]


def _without_unknown(
    cls: type[M], document: Any, exc: ValidationError, declared: str | None, context: dict
) -> M:
    version = declared if declared is not None else _declared_in(document)
    if not is_newer_minor(version):
        raise exc
    for _ in range(_PASSES):
        for loc in _unknown_keys(exc):
            _drop(document, loc)
        try:
            return cls.model_validate(document, context=context)
        except ValidationError as again:
            if not _unknown_keys(again):
                raise
            exc = again
    raise exc


def _declared_in(document: Any) -> object:
    return document.get("schema_version") if isinstance(document, dict) else None


def _drop(document: Any, loc: tuple[int | str, ...]) -> None:
    """Remove the key at ``loc`` (a validation error's path) from the parsed document."""
    *path, key = loc
    node = document
    try:
        for step in path:
            node = node[step]
    except (KeyError, IndexError, TypeError):
        return
    if isinstance(node, dict):
        node.pop(key, None)
