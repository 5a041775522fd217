"""Reading a fleet spec file: YAML to a checked ``FleetSpec``, every error on one line (or
one line per field) naming the file, the line or the field. The spec itself is
``epfleet.formats.spec``'s (pure)."""

from __future__ import annotations

import difflib
import typing
from pathlib import Path
from typing import Any

import yaml
from pydantic import BaseModel, ValidationError

from epfleet.errors import BadInputError
from epfleet.formats.spec import FleetSpec
from epfleet.formats.task_metric import MetricKind
from epfleet.text import printable

MAX_NESTING = 32
"""How deep a spec's YAML may nest (a fleet spec needs 5 levels): PyYAML composes nodes
recursively, and a deeper document would exhaust Python's stack."""
MAX_EXPANDED_VALUES = 100_000
"""How many values a spec may hold once its YAML aliases are expanded (a fleet of 1,000
models × 20 targets is a few tens of thousands): a few lines of nested aliases (the
"billion laughs") expand to billions, which took minutes and gigabytes before
MemoryError."""
MAX_ALIASED_CHARACTERS = 1_000_000
"""How many characters of text a spec's YAML aliases may repeat: one long string named
100,000 times is small in the file and in memory (PyYAML shares it) and a hundred
gigabytes in anything that writes the spec's values out (a flow's parameters, a log)."""


METRIC_TAGS = ("none", *typing.get_args(MetricKind))
"""A metric's kinds: the tags pydantic puts in the location of a metric's errors."""


def _location(loc: tuple[int | str, ...], data: Any) -> str:
    """Render a pydantic error location as models[ocr-det].input_shapes.x, naming list items.
    A tagged union's tag (``metric.argmax_agreement.min``: the metric's kind) is left out."""
    path, node = "", data
    for item in loc:
        if isinstance(node, dict) and item not in node and node.get("kind") == item:
            continue
        if isinstance(item, int):
            node = node[item] if isinstance(node, list) and item < len(node) else None
            label = node.get("name") if isinstance(node, dict) else None
            path += f"[{label or item}]"
        else:
            path += f".{item}" if path else str(item)
            node = node.get(item) if isinstance(node, dict) else None
    return printable(path) or "spec"  # a name or key may hold control characters


def _message(error: Any) -> str:
    """Pydantic's message, an unknown key's with the nearest known one."""
    if error["type"] != "extra_forbidden":
        return str(error["msg"]).removeprefix("Value error, ")
    *parent, key = error["loc"]
    tag = parent.pop() if parent and parent[-1] in METRIC_TAGS else None
    known = ["kind"] if tag == "none" else _known_keys(FleetSpec, parent)
    near = difflib.get_close_matches(str(key), known, n=1, cutoff=0.7)
    hint = f"did you mean {near[0]}?" if near else f"known keys: {', '.join(known)}"
    return f"unknown key; {hint}"


def _known_keys(model: type[BaseModel], loc: list[int | str]) -> list[str]:
    """The fields of the spec model found at ``loc`` (list indexes step into items)."""
    node: Any = model
    for item in loc:
        if isinstance(item, str) and isinstance(node, type) and issubclass(node, BaseModel):
            node = node.model_fields[item].annotation if item in node.model_fields else None
        node = _item_model(node)
    if isinstance(node, type) and issubclass(node, BaseModel):
        return list(node.model_fields)
    return []


def _item_model(annotation: Any) -> Any:
    """The pydantic model inside ``list[M]``, ``M | None`` and the like, else as it is."""
    if isinstance(annotation, type) and issubclass(annotation, BaseModel):
        return annotation
    for arg in typing.get_args(annotation):
        found = _item_model(arg)
        if isinstance(found, type) and issubclass(found, BaseModel):
            return found
    return annotation


def parse_spec(data: Any, origin: str = "spec") -> FleetSpec:
    """Validate a parsed YAML document; BadInputError naming each offending field."""
    if not isinstance(data, dict):
        raise BadInputError(f"{origin}: expected a mapping with 'models' and 'targets'")
    try:
        return FleetSpec.model_validate(data)
    except ValidationError as exc:
        problems = [
            f"{_location(tuple(err['loc']), data)}: {_message(err)}" for err in exc.errors()
        ]
        raise BadInputError(f"{origin} is invalid:\n  " + "\n  ".join(problems)) from None


def load_spec(path: Path) -> FleetSpec:
    """The spec at ``path``; BadInputError on one line naming the file (and the line, where
    known) when it cannot be read, is not UTF-8, is not YAML, nests too deep or expands too
    far through its aliases."""
    try:
        raw = path.read_bytes()
    except OSError as exc:
        raise BadInputError(f"cannot read spec {path}: {exc.strerror or exc}") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = raw[: exc.start].count(b"\n") + 1
        raise BadInputError(
            f"{path}:{line}: not UTF-8 text (byte 0x{raw[exc.start]:02x}); save the spec as UTF-8"
        ) from None
    try:
        data = _SpecLoader.load(text)
    except yaml.MarkedYAMLError as exc:
        mark = exc.problem_mark or exc.context_mark
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        problem = " ".join(str(exc.problem or exc.context).split())
        if exc.context and exc.problem:
            problem += f" ({' '.join(exc.context.split())})"
        kind = "" if isinstance(exc, (_TooDeep, _TooLarge)) else "not valid YAML: "
        raise BadInputError(f"{where}: {kind}{problem}") from None
    except yaml.YAMLError as exc:  # a character YAML does not allow, at a position
        position = getattr(exc, "position", None)
        at = f":{text[:position].count(chr(10)) + 1}" if isinstance(position, int) else ""
        problem = " ".join(str(exc).split("\n")[0].split())
        raise BadInputError(f"{path}{at}: not valid YAML: {problem}") from None
    return parse_spec(data, origin=str(path))


class _TooDeep(yaml.MarkedYAMLError):
    pass


class _TooLarge(yaml.MarkedYAMLError):
    pass


class _SpecLoader(yaml.SafeLoader):
    """PyYAML's safe loader, refusing documents nested deeper than ``MAX_NESTING``,
    holding more than ``MAX_EXPANDED_VALUES`` values once aliases are expanded, or
    repeating more than ``MAX_ALIASED_CHARACTERS`` characters of text through aliases
    (counted as the document is composed: each alias adds the size of what it names,
    measured once per anchored node)."""

    def __init__(self, text: str) -> None:
        super().__init__(text)
        self._depth = 0
        self._expanded = 0
        self._aliased_characters = 0
        self._sizes: dict[int, _Size] = {}

    @classmethod
    def load(cls, text: str) -> Any:
        loader = cls(text)
        try:
            return loader.get_single_data()
        finally:
            loader.dispose()

    def compose_node(self, parent: yaml.Node | None, index: int) -> yaml.Node | None:
        if self.check_event(yaml.AliasEvent):
            mark = self.peek_event().start_mark
            node = super().compose_node(parent, index)
            if node is not None:
                values, characters = _expanded_size(node, self._sizes)
                self._count(values, mark)
                self._count_aliased_text(characters, mark)
            return node
        self._count(1, None)
        self._depth += 1
        try:
            if self._depth > MAX_NESTING:
                mark = self.peek_event().start_mark
                raise _TooDeep(
                    problem=f"nested more than {MAX_NESTING} levels deep (a fleet spec needs 5)",
                    problem_mark=mark,
                )
            return super().compose_node(parent, index)
        finally:
            self._depth -= 1

    def _count(self, values: int, mark: yaml.Mark | None) -> None:
        self._expanded += values
        if self._expanded > MAX_EXPANDED_VALUES:
            raise _TooLarge(
                problem=f"expands to more than {MAX_EXPANDED_VALUES:,} values through YAML "
                "aliases (*name); write the repeated part out, or use fewer aliases",
                problem_mark=mark or self.peek_event().start_mark,
            )

    def _count_aliased_text(self, characters: int, mark: yaml.Mark) -> None:
        self._aliased_characters += characters
        if self._aliased_characters > MAX_ALIASED_CHARACTERS:
            raise _TooLarge(
                problem=f"repeats more than {MAX_ALIASED_CHARACTERS:,} characters of text "
                "through YAML aliases (*name); write the repeated part out, or use fewer "
                "aliases",
                problem_mark=mark,
            )


_Size = tuple[int, int]
"""Values, and characters of text in them (keys and scalars)."""


def _expanded_size(node: yaml.Node, sizes: dict[int, _Size]) -> _Size:
    """How many values ``node`` holds with every alias in it expanded, and how many
    characters of text they hold (memoised by node: an anchored node is measured once
    however often it is named)."""
    known = sizes.get(id(node))
    if known is not None:
        return known
    if isinstance(node, yaml.SequenceNode):
        children = [_expanded_size(child, sizes) for child in node.value]
    elif isinstance(node, yaml.MappingNode):
        children = [_expanded_size(part, sizes) for pair in node.value for part in pair]
    else:
        children = [(0, len(str(node.value)))]
    size = (1 + sum(v for v, _ in children), sum(c for _, c in children))
    sizes[id(node)] = size
    return size
