"""Decodes a gzipped pprof profile.proto with Python's protobuf package (not memtrack's
encoder): the message types are described here from pprof's proto/profile.proto field numbers
and built at run time (no protoc needed). Prints JSON: the sample types, the default one, the
sums of each sample value, the mappings in order as [file, build id], and per sample its value,
its stack (leaf first), each location as its lines [function, file, line] (innermost first),
and each location's mapping's file ("" for none).

Usage: python3 pprof_decode.py FILE"""
import gzip
import json
import sys

from google.protobuf import descriptor_pb2, descriptor_pool, message_factory

F = descriptor_pb2.FieldDescriptorProto
MESSAGES = {
    "Profile": [
        ("sample_type", 1, F.TYPE_MESSAGE, F.LABEL_REPEATED, "ValueType"),
        ("sample", 2, F.TYPE_MESSAGE, F.LABEL_REPEATED, "Sample"),
        ("mapping", 3, F.TYPE_MESSAGE, F.LABEL_REPEATED, "Mapping"),
        ("location", 4, F.TYPE_MESSAGE, F.LABEL_REPEATED, "Location"),
        ("function", 5, F.TYPE_MESSAGE, F.LABEL_REPEATED, "Function"),
        ("string_table", 6, F.TYPE_STRING, F.LABEL_REPEATED, None),
        ("drop_frames", 7, F.TYPE_INT64, F.LABEL_OPTIONAL, None),
        ("keep_frames", 8, F.TYPE_INT64, F.LABEL_OPTIONAL, None),
        ("time_nanos", 9, F.TYPE_INT64, F.LABEL_OPTIONAL, None),
        ("duration_nanos", 10, F.TYPE_INT64, F.LABEL_OPTIONAL, None),
        ("period_type", 11, F.TYPE_MESSAGE, F.LABEL_OPTIONAL, "ValueType"),
        ("period", 12, F.TYPE_INT64, F.LABEL_OPTIONAL, None),
        ("comment", 13, F.TYPE_INT64, F.LABEL_REPEATED, None),
        ("default_sample_type", 14, F.TYPE_INT64, F.LABEL_OPTIONAL, None),
    ],
    "ValueType": [
        ("type", 1, F.TYPE_INT64, F.LABEL_OPTIONAL, None),
        ("unit", 2, F.TYPE_INT64, F.LABEL_OPTIONAL, None),
    ],
    "Sample": [
        ("location_id", 1, F.TYPE_UINT64, F.LABEL_REPEATED, None),
        ("value", 2, F.TYPE_INT64, F.LABEL_REPEATED, None),
    ],
    "Mapping": [
        ("id", 1, F.TYPE_UINT64, F.LABEL_OPTIONAL, None),
        ("memory_start", 2, F.TYPE_UINT64, F.LABEL_OPTIONAL, None),
        ("memory_limit", 3, F.TYPE_UINT64, F.LABEL_OPTIONAL, None),
        ("file_offset", 4, F.TYPE_UINT64, F.LABEL_OPTIONAL, None),
        ("filename", 5, F.TYPE_INT64, F.LABEL_OPTIONAL, None),
        ("build_id", 6, F.TYPE_INT64, F.LABEL_OPTIONAL, None),
        ("has_functions", 7, F.TYPE_BOOL, F.LABEL_OPTIONAL, None),
        ("has_filenames", 8, F.TYPE_BOOL, F.LABEL_OPTIONAL, None),
        ("has_line_numbers", 9, F.TYPE_BOOL, F.LABEL_OPTIONAL, None),
        ("has_inline_frames", 10, F.TYPE_BOOL, F.LABEL_OPTIONAL, None),
    ],
    "Location": [
        ("id", 1, F.TYPE_UINT64, F.LABEL_OPTIONAL, None),
        ("mapping_id", 2, F.TYPE_UINT64, F.LABEL_OPTIONAL, None),
        ("address", 3, F.TYPE_UINT64, F.LABEL_OPTIONAL, None),
        ("line", 4, F.TYPE_MESSAGE, F.LABEL_REPEATED, "Line"),
        ("is_folded", 5, F.TYPE_BOOL, F.LABEL_OPTIONAL, None),
    ],
    "Line": [
        ("function_id", 1, F.TYPE_UINT64, F.LABEL_OPTIONAL, None),
        ("line", 2, F.TYPE_INT64, F.LABEL_OPTIONAL, None),
        ("column", 3, F.TYPE_INT64, F.LABEL_OPTIONAL, None),
    ],
    "Function": [
        ("id", 1, F.TYPE_UINT64, F.LABEL_OPTIONAL, None),
        ("name", 2, F.TYPE_INT64, F.LABEL_OPTIONAL, None),
        ("system_name", 3, F.TYPE_INT64, F.LABEL_OPTIONAL, None),
        ("filename", 4, F.TYPE_INT64, F.LABEL_OPTIONAL, None),
        ("start_line", 5, F.TYPE_INT64, F.LABEL_OPTIONAL, None),
    ],
}


def profile_class():
    fd = descriptor_pb2.FileDescriptorProto(
        name="profile.proto", package="perftools.profiles", syntax="proto3"
    )
    for name, fields in MESSAGES.items():
        m = fd.message_type.add(name=name)
        for fname, number, ftype, label, type_name in fields:
            f = m.field.add(name=fname, number=number, type=ftype, label=label)
            if type_name:
                f.type_name = ".perftools.profiles." + type_name
    pool = descriptor_pool.DescriptorPool()
    pool.Add(fd)
    return message_factory.GetMessageClass(
        pool.FindMessageTypeByName("perftools.profiles.Profile")
    )


def main(path):
    with open(path, "rb") as f:
        raw = gzip.decompress(f.read())
    p = profile_class()()
    p.ParseFromString(raw)
    st = p.string_table
    assert st[0] == "", "string_table[0] must be empty"
    funcs = {f.id: f for f in p.function}
    locs = {l.id: l for l in p.location}
    mappings = {m.id: m for m in p.mapping}
    for l in p.location:
        assert l.mapping_id == 0 or l.mapping_id in mappings, "location of an undefined mapping"
    types = [[st[t.type], st[t.unit]] for t in p.sample_type]
    sums = [0] * len(types)
    samples = []
    for s in p.sample:
        assert len(s.value) == len(types), "a sample without a value per type"
        for i, v in enumerate(s.value):
            sums[i] += v
        stack = []
        modules = []
        for lid in s.location_id:
            loc = locs[lid]
            stack.append(
                [[st[funcs[ln.function_id].name], st[funcs[ln.function_id].filename], ln.line]
                 for ln in loc.line]
            )
            modules.append(st[mappings[loc.mapping_id].filename] if loc.mapping_id else "")
        samples.append({"value": list(s.value), "stack": stack, "mappings": modules})
    print(json.dumps({
        "sample_types": types,
        "default_sample_type": st[p.default_sample_type],
        "period_type": [st[p.period_type.type], st[p.period_type.unit]],
        "sums": sums,
        "mappings": [[st[m.filename], st[m.build_id]] for m in p.mapping],
        "samples": samples,
    }))


main(sys.argv[1])
