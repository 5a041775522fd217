"""The op types of a model's main graph, read from the ONNX file's protobuf encoding.

The device's health check counts a variant's EPContext nodes for its profile. Reading
them with ``onnx.load`` imported ``onnx`` (and ``ml_dtypes``) into every health-check
worker, about a second of CPU per worker for one list of strings; this reads the three
fields it needs (``ModelProto.graph``, ``GraphProto.node``, ``NodeProto.op_type``) and
steps over every other field by its wire type, without decoding it.
"""

from __future__ import annotations

from pathlib import Path

MODEL_GRAPH, GRAPH_NODE, NODE_OP_TYPE = 7, 1, 4
"""Field numbers in onnx.proto."""

VARINT, FIXED64, LENGTH_DELIMITED, FIXED32 = 0, 1, 2, 5
"""Protobuf wire types (groups, 3 and 4, are not used by onnx.proto)."""


def _varint(data: memoryview, at: int) -> tuple[int, int]:
    value = shift = 0
    while True:
        if at >= len(data):
            raise ValueError("truncated varint")
        byte = data[at]
        at += 1
        value |= (byte & 0x7F) << shift
        if not byte & 0x80:
            return value, at
        shift += 7


def _fields(data: memoryview, number: int) -> list[memoryview]:
    """The values of the length-delimited field ``number`` in the message ``data``, in
    order (a repeated field, or a message field given more than once, which protobuf
    merges)."""
    found, at = [], 0
    while at < len(data):
        key, at = _varint(data, at)
        wire = key & 7
        if wire == VARINT:
            _, at = _varint(data, at)
        elif wire == FIXED64:
            at += 8
        elif wire == FIXED32:
            at += 4
        elif wire == LENGTH_DELIMITED:
            size, at = _varint(data, at)
            if at + size > len(data):
                raise ValueError("truncated field")
            if key >> 3 == number:
                found.append(data[at : at + size])
            at += size
        else:
            raise ValueError(f"unexpected wire type {wire}")
    if at != len(data):
        raise ValueError("truncated message")
    return found


def graph_op_types(path: str | Path) -> list[str]:
    """The op type of each node of the model's main graph (not of its subgraphs), in order,
    as ``[n.op_type for n in onnx.load(path, load_external_data=False).graph.node]``.
    Raises ValueError for bytes that are not a protobuf message."""
    model = memoryview(Path(path).read_bytes())
    return [
        _last_string(node, NODE_OP_TYPE)
        for graph in _fields(model, MODEL_GRAPH)
        for node in _fields(graph, GRAPH_NODE)
    ]


def _last_string(message: memoryview, number: int) -> str:
    """A string field's value: its last occurrence, as protobuf reads it ("" if absent)."""
    values = _fields(message, number)
    return bytes(values[-1]).decode() if values else ""
