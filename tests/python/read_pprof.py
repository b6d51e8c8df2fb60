#!/usr/bin/env python3
"""Decodes a gzipped pprof profile with Google's protobuf package and prints
it as JSON, names resolved, for tests/pprof.rs to compare with the report.

    python3 tests/python/read_pprof.py PROFILE.pb.gz

The messages are compiled at run time with protoc from the part of the
public profile.proto specification (github.com/google/pprof) written below:
the decoder is protobuf's, not memleak's. Structural problems (string
indexes out of range, ids not numbered from 1, dangling references, a
location outside its mapping) are listed under "problems". Missing modules
or protoc are an error, not a skip: CI installs them (scripts/setup.sh).
"""

import gzip
import importlib
import json
import os
import subprocess
import sys
import tempfile

PROTO = """
syntax = "proto3";
package perftools.profiles;
message Profile {
  repeated ValueType sample_type = 1;
  repeated Sample sample = 2;
  repeated Mapping mapping = 3;
  repeated Location location = 4;
  repeated Function function = 5;
  repeated string string_table = 6;
  int64 drop_frames = 7;
  int64 keep_frames = 8;
  int64 time_nanos = 9;
  int64 duration_nanos = 10;
  ValueType period_type = 11;
  int64 period = 12;
  repeated int64 comment = 13;
  int64 default_sample_type = 14;
}
message ValueType { int64 type = 1; int64 unit = 2; }
message Sample {
  repeated uint64 location_id = 1;
  repeated int64 value = 2;
  repeated Label label = 3;
}
message Label { int64 key = 1; int64 str = 2; int64 num = 3; int64 num_unit = 4; }
message Mapping {
  uint64 id = 1;
  uint64 memory_start = 2;
  uint64 memory_limit = 3;
  uint64 file_offset = 4;
  int64 filename = 5;
  int64 build_id = 6;
  bool has_functions = 7;
  bool has_filenames = 8;
  bool has_line_numbers = 9;
  bool has_inline_frames = 10;
}
message Location {
  uint64 id = 1;
  uint64 mapping_id = 2;
  uint64 address = 3;
  repeated Line line = 4;
  bool is_folded = 5;
}
message Line { uint64 function_id = 1; int64 line = 2; int64 column = 3; }
message Function {
  uint64 id = 1;
  int64 name = 2;
  int64 system_name = 3;
  int64 filename = 4;
  int64 start_line = 5;
}
"""


def compile_proto(tmp):
    with open(os.path.join(tmp, "profile.proto"), "w") as f:
        f.write(PROTO)
    subprocess.run(
        ["protoc", f"--proto_path={tmp}", f"--python_out={tmp}", "profile.proto"],
        check=True,
    )
    sys.path.insert(0, tmp)
    return importlib.import_module("profile_pb2")


def main():
    with tempfile.TemporaryDirectory() as tmp:
        pb = compile_proto(tmp)
        with open(sys.argv[1], "rb") as f:
            raw = f.read()
        p = pb.Profile()
        p.ParseFromString(gzip.decompress(raw))

    problems = []
    strings = list(p.string_table)
    if not strings or strings[0] != "":
        problems.append("string_table[0] is not the empty string")
    if len(set(strings)) != len(strings):
        problems.append("string_table has duplicates")

    def s(i):
        if not 0 <= i < len(strings):
            problems.append(f"string index {i} out of range")
            return None
        return strings[i]

    def by_id(items, what):
        out = {}
        for n, item in enumerate(items):
            if item.id != n + 1:
                problems.append(f"{what} {n} has id {item.id}, not {n + 1}")
            out[item.id] = item
        return out

    mappings = by_id(p.mapping, "mapping")
    locations = by_id(p.location, "location")
    functions = by_id(p.function, "function")

    def function(fid):
        f = functions.get(fid)
        if f is None:
            problems.append(f"function {fid} does not exist")
            return {}
        return {"name": s(f.name), "system_name": s(f.system_name), "file": s(f.filename)}

    def location(lid):
        loc = locations.get(lid)
        if loc is None:
            problems.append(f"location {lid} does not exist")
            return {}
        if loc.mapping_id:
            m = mappings.get(loc.mapping_id)
            if m is None:
                problems.append(f"location {lid}: mapping {loc.mapping_id} does not exist")
            elif not m.memory_start <= loc.address < m.memory_limit:
                problems.append(f"location {lid}: address {loc.address:#x} outside mapping {m.id}")
        return {
            "address": loc.address,
            "mapping": loc.mapping_id,
            "lines": [
                dict(function(l.function_id), line=l.line, column=l.column) for l in loc.line
            ],
        }

    def label(l):
        if l.str:
            return s(l.key), s(l.str)
        return s(l.key), l.num

    out = {
        "sample_types": [[s(t.type), s(t.unit)] for t in p.sample_type],
        "default_sample_type": s(p.default_sample_type),
        "period_type": [s(p.period_type.type), s(p.period_type.unit)],
        "period": p.period,
        "time_nanos": p.time_nanos,
        "duration_nanos": p.duration_nanos,
        "comments": [s(c) for c in p.comment],
        "mappings": [
            {
                "id": m.id,
                "start": m.memory_start,
                "limit": m.memory_limit,
                "offset": m.file_offset,
                "file": s(m.filename),
                "build_id": s(m.build_id),
                "has_functions": m.has_functions,
                "has_inline_frames": m.has_inline_frames,
            }
            for m in p.mapping
        ],
        "samples": [
            {
                "values": list(x.value),
                "labels": dict(label(l) for l in x.label),
                "locations": [location(i) for i in x.location_id],
            }
            for x in p.sample
        ],
        "problems": problems,
    }
    for x in p.sample:
        if len(x.value) != len(p.sample_type):
            problems.append(f"a sample has {len(x.value)} values for {len(p.sample_type)} types")
    json.dump(out, sys.stdout)


main()
