"""Chakra execution traces (mlcommons/chakra schema/protobuf/et_def.proto), without protoc.

The message classes are built at run time from a FileDescriptorProto that declares the
subset of et_def.proto ccbench writes (same package, names, field numbers and types), so
files are readable by Chakra's own tools. A file is varint32-length-delimited messages:
one GlobalMetadata, then Nodes (optionally gzip-compressed).
"""

from __future__ import annotations

import gzip
import os
from collections.abc import Iterable, Iterator
from functools import lru_cache
from typing import Any

from ccbench.collectives import every
from ccbench.errors import UsageError
from ccbench.safeio import read_input

__all__ = ["COLL_TYPES", "NODE_TYPES", "classes", "comm_coll_node", "read_trace", "write_trace",
           "encode_varint", "decode_varint", "node_attrs", "attr_value"]

NODE_TYPES = {"INVALID_NODE": 0, "METADATA_NODE": 1, "MEM_LOAD_NODE": 2, "MEM_STORE_NODE": 3,
              "COMP_NODE": 4, "COMM_SEND_NODE": 5, "COMM_RECV_NODE": 6, "COMM_COLL_NODE": 7}
COLL_TYPES = {"ALL_REDUCE": 0, "REDUCE": 1, "ALL_GATHER": 2, "GATHER": 3, "SCATTER": 4,
              "BROADCAST": 5, "ALL_TO_ALL": 6, "REDUCE_SCATTER": 7, "REDUCE_SCATTER_BLOCK": 8,
              "BARRIER": 9}
# ccbench's collectives (the registry's rule) and the other rooted reduce traces hold
COLLECTIVE_TO_COMM = {c.name: c.export.chakra for c in every() if c.export is not None} \
    | {"reduce": "REDUCE"}

# AttributeProto value oneof: (field name, number, scalar type or list message)
_ATTR_SCALARS = [("double_val", 3, "TYPE_DOUBLE"), ("float_val", 5, "TYPE_FLOAT"),
                 ("int32_val", 7, "TYPE_INT32"), ("int64_val", 9, "TYPE_INT64"),
                 ("uint32_val", 11, "TYPE_UINT32"), ("uint64_val", 13, "TYPE_UINT64"),
                 ("sint32_val", 15, "TYPE_SINT32"), ("sint64_val", 17, "TYPE_SINT64"),
                 ("fixed32_val", 19, "TYPE_FIXED32"), ("fixed64_val", 21, "TYPE_FIXED64"),
                 ("sfixed32_val", 23, "TYPE_SFIXED32"), ("sfixed64_val", 25, "TYPE_SFIXED64"),
                 ("bool_val", 27, "TYPE_BOOL"), ("string_val", 29, "TYPE_STRING"),
                 ("bytes_val", 31, "TYPE_BYTES")]
_ATTR_LISTS = [("double_list", 4, "DoubleList", "TYPE_DOUBLE"),
               ("float_list", 6, "FloatList", "TYPE_FLOAT"),
               ("int32_list", 8, "Int32List", "TYPE_INT32"),
               ("int64_list", 10, "Int64List", "TYPE_INT64"),
               ("uint32_list", 12, "Uint32List", "TYPE_UINT32"),
               ("uint64_list", 14, "Uint64List", "TYPE_UINT64"),
               ("sint32_list", 16, "Sint32List", "TYPE_SINT32"),
               ("sint64_list", 18, "Sint64List", "TYPE_SINT64"),
               ("fixed32_list", 20, "Fixed32List", "TYPE_FIXED32"),
               ("fixed64_list", 22, "Fixed64List", "TYPE_FIXED64"),
               ("sfixed32_list", 24, "Sfixed32List", "TYPE_SFIXED32"),
               ("sfixed64_list", 26, "Sfixed64List", "TYPE_SFIXED64"),
               ("bool_list", 28, "BoolList", "TYPE_BOOL"),
               ("string_list", 30, "StringList", "TYPE_STRING"),
               ("bytes_list", 32, "BytesList", "TYPE_BYTES")]


# open-shaped: the installed Chakra schema's protobuf classes, by message name
@lru_cache(maxsize=1)
def classes() -> dict[str, Any]:
    """GlobalMetadata, Node, AttributeProto, IOInfo and the list messages, by name."""
    try:
        from google.protobuf import descriptor_pb2, descriptor_pool, message_factory
    except ImportError:
        raise UsageError("Chakra export needs the protobuf package "
                         "(pip install 'ccbench[model]')") from None
    F = descriptor_pb2.FieldDescriptorProto
    fdp = descriptor_pb2.FileDescriptorProto(name="ccbench_et_def.proto", package="ChakraProtoMsg",
                                             syntax="proto3")

    def field(msg, name, number, ftype, label="LABEL_OPTIONAL", type_name=None, oneof=None):
        f = msg.field.add(name=name, number=number, type=getattr(F, ftype),
                          label=getattr(F, label))
        if type_name:
            f.type_name = f".ChakraProtoMsg.{type_name}"
        if oneof is not None:
            f.oneof_index = oneof
        return f

    for _, _, list_name, elem in _ATTR_LISTS:
        m = fdp.message_type.add(name=list_name)
        field(m, "values", 1, elem, "LABEL_REPEATED")
    attr = fdp.message_type.add(name="AttributeProto")
    attr.oneof_decl.add(name="value")
    field(attr, "name", 1, "TYPE_STRING")
    field(attr, "doc_string", 2, "TYPE_STRING")
    entries = [(n, num, t, None) for n, num, t in _ATTR_SCALARS] + \
              [(n, num, "TYPE_MESSAGE", ln) for n, num, ln, _ in _ATTR_LISTS]
    for name, number, ftype, tname in sorted(entries, key=lambda e: e[1]):
        field(attr, name, number, ftype, type_name=tname, oneof=0)
    gm = fdp.message_type.add(name="GlobalMetadata")
    field(gm, "version", 1, "TYPE_STRING")
    field(gm, "attr", 2, "TYPE_MESSAGE", "LABEL_REPEATED", "AttributeProto")
    io = fdp.message_type.add(name="IOInfo")
    for i, name in enumerate(("values", "shapes", "types"), start=1):
        field(io, name, i, "TYPE_STRING")
    nt = fdp.enum_type.add(name="NodeType")
    for name, number in NODE_TYPES.items():
        nt.value.add(name=name, number=number)
    ct = fdp.enum_type.add(name="CollectiveCommType")
    for name, number in COLL_TYPES.items():
        ct.value.add(name=name, number=number)
    node = fdp.message_type.add(name="Node")
    field(node, "id", 1, "TYPE_UINT64")
    field(node, "name", 2, "TYPE_STRING")
    f = field(node, "type", 3, "TYPE_ENUM")
    f.type_name = ".ChakraProtoMsg.NodeType"
    field(node, "ctrl_deps", 4, "TYPE_UINT64", "LABEL_REPEATED")
    field(node, "data_deps", 5, "TYPE_UINT64", "LABEL_REPEATED")
    field(node, "start_time_micros", 6, "TYPE_UINT64")
    field(node, "duration_micros", 7, "TYPE_UINT64")
    field(node, "inputs", 8, "TYPE_MESSAGE", type_name="IOInfo")
    field(node, "outputs", 9, "TYPE_MESSAGE", type_name="IOInfo")
    field(node, "attr", 10, "TYPE_MESSAGE", "LABEL_REPEATED", "AttributeProto")
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fdp)
    out = {}
    for name in ["GlobalMetadata", "Node", "AttributeProto", "IOInfo"] + \
            [ln for _, _, ln, _ in _ATTR_LISTS]:
        desc = pool.FindMessageTypeByName(f"ChakraProtoMsg.{name}")
        out[name] = message_factory.GetMessageClass(desc)
    return out


def encode_varint(value: int) -> bytes:
    out = bytearray()
    while True:
        bits = value & 0x7F
        value >>= 7
        if value:
            out.append(bits | 0x80)
        else:
            out.append(bits)
            return bytes(out)


def decode_varint(data: bytes, pos: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= len(data):
            raise UsageError("truncated Chakra trace (varint runs past the end)")
        b = data[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if not b & 0x80:
            return result, pos
        shift += 7
        if shift > 63:
            raise UsageError("corrupt Chakra trace (varint longer than 10 bytes)")


def _attr(name: str, value: Any) -> Any:
    a = classes()["AttributeProto"](name=name)
    if isinstance(value, bool):
        a.bool_val = value
    elif isinstance(value, int):
        a.int64_val = value
    elif isinstance(value, float):
        a.double_val = value
    elif isinstance(value, str):
        a.string_val = value
    elif isinstance(value, (list, tuple)) and all(isinstance(v, bool) for v in value):
        a.bool_list.values.extend(value)
    else:
        raise TypeError(f"attribute {name}: unsupported value {value!r}")
    return a


def attr_value(a: Any) -> Any:
    which = a.WhichOneof("value")
    if which is None:
        return None
    v = getattr(a, which)
    return list(v.values) if which.endswith("_list") else v


def comm_coll_node(node_id: int, name: str, collective: str, comm_size: int,
                   deps: Iterable[int] = (), start_us: int = 0, duration_us: int = 0,
                   pg_name: str | None = None, involved_dim: list[bool] | None = None) -> Any:
    """A COMM_COLL node; comm_size in bytes as ASTRA-sim reads it (all-gather: per-rank shard)."""
    try:
        comm = COLL_TYPES[COLLECTIVE_TO_COMM[collective]]
    except KeyError:
        raise UsageError(f"no Chakra collective type for {collective!r} "
                         f"(valid: {', '.join(COLLECTIVE_TO_COMM)})") from None
    node = classes()["Node"](id=node_id, name=name or f"{collective}_{node_id}",
                             type=NODE_TYPES["COMM_COLL_NODE"], start_time_micros=start_us,
                             duration_micros=duration_us)
    node.ctrl_deps.extend(deps)
    node.attr.extend([_attr("is_cpu_op", False), _attr("comm_type", comm),
                      _attr("comm_size", int(comm_size))])
    if pg_name is not None:
        node.attr.append(_attr("pg_name", pg_name))
    if involved_dim is not None:
        node.attr.append(_attr("involved_dim", list(involved_dim)))
    return node


# metadata open-shaped: GlobalMetadata attributes, whichever the caller names
def write_trace(path: str | os.PathLike[str], nodes: Iterable[Any], version: str = "0.0.4",
                metadata: dict[str, Any] | None = None) -> None:
    gm = classes()["GlobalMetadata"](version=version)
    for k, v in (metadata or {}).items():
        gm.attr.append(_attr(k, v))
    chunks = []
    for msg in [gm, *nodes]:
        body = msg.SerializeToString()
        chunks.append(encode_varint(len(body)) + body)
    data = b"".join(chunks)
    if str(path).endswith(".gz"):
        data = gzip.compress(data, mtime=0)
    with open(path, "wb") as handle:
        handle.write(data)


def _messages(data: bytes) -> Iterator[memoryview]:
    pos, view = 0, memoryview(data)
    while pos < len(data):
        start = pos
        n, pos = decode_varint(data, pos)
        if pos + n > len(data):
            raise UsageError("truncated Chakra trace (message runs past the end)")
        if n == 0:       # no real node is empty; a file of zero bytes would be one per byte
            raise UsageError(f"not a Chakra trace (an empty message at byte {start})")
        yield view[pos:pos + n]
        pos += n


#: bytes one node takes once parsed, through simulate (its protobuf message, ccbench's op and
#: what is derived from it): measured 2.7-2.8 KB for nodes of 57 and 71 bytes, so a file of
#: small nodes needs far more than its size suggests
NODE_MEMORY = 3000


def _count_messages(data: bytes) -> int:
    """Messages in the file, counted without building them (what parsing will hold)."""
    pos, count, end = 0, 0, len(data)
    while pos < end:
        start = pos
        n, pos = decode_varint(data, pos)
        if n == 0:                  # as _messages says it, before any memory is counted
            raise UsageError(f"not a Chakra trace (an empty message at byte {start})")
        pos += n
        count += 1
    return count


def read_trace(path: str | os.PathLike[str]) -> tuple[Any, list[Any]]:
    """(GlobalMetadata, [Node, ...]) of one .et file (gzip detected by magic bytes), read
    within the input cap (ccbench.safeio)."""
    try:
        data = read_input(path)
    except FileNotFoundError:
        raise UsageError(f"no such Chakra trace: {str(path)!r}") from None
    except OSError as exc:
        raise UsageError(f"{path}: cannot read ({exc.strerror or exc})") from None
    nodes_held = _count_messages(data) - 1
    if nodes_held > 0:
        from ccbench.safeio import check_memory

        check_memory(f"{path}: a Chakra trace of {nodes_held:,} nodes", nodes_held * NODE_MEMORY)
    messages = _messages(data)
    first = next(messages, None)
    if first is None:
        raise UsageError(f"{path}: empty Chakra trace (no GlobalMetadata)")
    cls = classes()
    gm = cls["GlobalMetadata"]()
    gm.ParseFromString(first)
    if not gm.version:
        raise UsageError(f"{path}: not a Chakra trace (its GlobalMetadata names no version)")
    nodes = []
    for body in messages:
        node = cls["Node"]()
        node.ParseFromString(body)
        nodes.append(node)
    return gm, nodes


# open-shaped: a node's attributes, whichever the trace gives it
def node_attrs(node: Any) -> dict[str, Any]:
    return {a.name: attr_value(a) for a in node.attr}
