"""Command-line options built from pydantic models, and the option types commands share.

A flow that takes a pydantic model as a parameter (the device-sync flow's ``policy``)
gets the same model on the command line: ``options_from`` keeps each field's type,
default, constraints and description, and adds only how the command line spells it.
Cyclopts hands the options to pydantic, so a bad value fails with the model's own
message; ``cli_error`` names the option in it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar, cast

from cyclopts import CycloptsError, Parameter

if TYPE_CHECKING:
    from pydantic import BaseModel

M = TypeVar("M", bound="BaseModel")

Json = Annotated[bool, Parameter(name="--json", allow_repeating=True)]
Store = Annotated[
    str, Parameter(help="The store: a directory, file:///abs/dir or s3://bucket/prefix.")
]
TrustRoot = Annotated[
    Path | None,
    Parameter(
        help="A root.json of the store's signed metadata (trust init's) to pin: the store "
        "must chain to it, or nothing is read nor published. Kept in the worker cache "
        "(EPFLEET_CACHE): later commands on this host need it no more."
    ),
]
Repeatable = Annotated[list[str] | None, Parameter(negative_iterable=())]
"""A repeatable option (``--model a --model b``), all when not given."""
RunnerName = Literal["threads", "dask"]
"""The names of ``epfleet.fleet.runs.task_runners.TASK_RUNNERS``
(tests/cli/test_options.py keeps them equal)."""

OPTION_NAMES: dict[str, str] = {}
"""Model fields whose option is not ``--<field-name>`` (``options_from`` records them)."""


def options_from(
    model: type[M], parameters: dict[str, Parameter], comma_lists: tuple[str, ...] = ()
) -> type[M]:
    """``model`` as command-line options: a subclass with its fields' types, defaults,
    constraints and descriptions, a cyclopts ``Parameter`` for the fields the command
    line spells differently, and comma-separated values accepted for the list fields
    named. Annotate the command's parameter with ``Parameter(name="*")``."""
    from pydantic import create_model, field_validator

    fields: dict[str, Any] = {}
    for name, how in parameters.items():
        info = model.model_fields[name]
        fields[name] = (Annotated[info.annotation, how], info)
        if isinstance(how.name, tuple) and how.name:
            OPTION_NAMES[name] = how.name[0]

    def split(value: Any) -> Any:
        values = [value] if isinstance(value, str) else value
        if not isinstance(values, list):
            return value
        items = [part.strip() for v in values for part in str(v).split(",") if part.strip()]
        if not items:
            raise ValueError("expected one or more comma-separated values")
        return items

    checks = {f"split_{name}": field_validator(name, mode="before")(split) for name in comma_lists}
    made = create_model(
        f"{model.__name__}Options",
        __base__=model,
        __module__=model.__module__,
        __validators__=checks,
        **fields,
    )
    return cast("type[M]", made)


def cli_error(exc: CycloptsError) -> str:
    """The message of a command-line error: one part per problem, naming the option
    (pydantic's errors name the model's fields)."""
    from pydantic import ValidationError

    if isinstance(exc.__cause__, ValidationError):
        return "; ".join(
            f"{option_name(str(e['loc'][0]))}: {e['msg']}, got {e['input']!r}"
            for e in exc.__cause__.errors()
        )
    return str(exc).strip()


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """``; did you mean 'sync'?`` when one of ``choices`` is close to ``word`` (a typo),
    else ""."""
    import difflib

    names = [c for c in choices if not c.startswith("-")]
    match = difflib.get_close_matches(word, names, n=1, cutoff=0.6)
    return f"; did you mean {match[0]!r}?" if match else ""


def unknown_command(exc: CycloptsError) -> str | None:
    """The message of a subcommand that does not exist, with the closest one and the list;
    None for other errors."""
    from cyclopts.exceptions import UnknownCommandError

    if not isinstance(exc, UnknownCommandError) or not exc.unused_tokens or exc.app is None:
        return None
    word = exc.unused_tokens[0]
    names = [c for c in exc.app if not c.startswith("-")]
    return f"unknown command {word!r}{did_you_mean(word, names)} (one of: {', '.join(names)})"


def option_name(field: str) -> str:
    return OPTION_NAMES.get(field, "--" + field.replace("_", "-"))


def default_text(value: Any) -> Any:
    """Defaults as help shows them: none for an off flag or an empty list (all), lists
    comma-separated."""
    if value is False or value == []:
        return None
    return ",".join(str(v) for v in value) if isinstance(value, list) else value


def reflow_parameters(doc: str | None) -> str | None:
    """``doc`` with each sentence-run of its text on one line, and each description of its
    numpydoc ``Parameters`` section too: help in plain text keeps a docstring's line
    breaks, which a terminal of another width turns into ragged lines broken mid-phrase.
    Indented lines (examples) and the line after one ending in ``:`` are kept as written."""
    if not doc:
        return doc
    head, marker, section = doc.partition("Parameters\n")
    head = _reflow_prose(head)
    if not marker:
        return head
    lines: list[str] = []
    for line in section.splitlines():
        continuing = lines and line.startswith(" " * 8) and lines[-1].startswith(" " * 8)
        if continuing and line.strip():
            lines[-1] += " " + line.strip()
        else:
            lines.append(line)
    return head + "Parameters\n" + "\n".join(lines) + "\n"


def _reflow_prose(text: str) -> str:
    lines = text.split("\n")
    base = min((len(x) - len(x.lstrip()) for x in lines[1:] if x.strip()), default=0)

    def prose(n: int) -> bool:  # the first line is the docstring's, never indented
        line = lines[n]
        return bool(line.strip()) and (n == 0 or len(line) - len(line.lstrip()) == base)

    out: list[str] = []
    for n, line in enumerate(lines):
        previous = out[-1] if out else ""
        joins = n > 0 and prose(n) and prose(n - 1) and not previous.endswith(":")
        if joins:
            out[-1] = previous + " " + line.strip()
        else:
            out.append(line)
    return "\n".join(out)


def command_help(*commands: Callable[..., Any]) -> None:
    """Reflow the ``Parameters`` of each command's docstring, which is its help; each
    command module calls it for its own commands, as the app imports a command's module
    only when that command runs (``epfleet.cli.app``)."""
    for command in commands:
        command.__doc__ = reflow_parameters(command.__doc__)


def pin_trust_root(store: str, trust_root: Path | None) -> None:
    """Pin ``--trust-root`` for ``store`` in the worker cache (``epfleet.trust.pins``), so
    that every read of the store below goes through it."""
    if trust_root is not None:
        from epfleet.stores import open_store
        from epfleet.trust.pins import pin_given_root

        pin_given_root(open_store(store), trust_root)
