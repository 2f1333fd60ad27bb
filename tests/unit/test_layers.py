#!/usr/bin/env python3
"""The layer graph in docs/design.md is CMake's: test_layers.py LAYERS_TXT DESIGN_MD.

LAYERS_TXT (written by tests/unit/CMakeLists.txt from shim/CMakeLists.txt's
lazypin_layer calls) has one line per layer, "NAME: what it may use" (the
closure of its BELOW). design.md's layers table names, per folder, the
layers it may use; both must agree, layer by layer, and list the same layers.
"""
import re
import sys


def cmake_graph(path):
    graph = {}
    with open(path) as f:
        for line in f:
            if ":" in line:
                name, uses = line.split(":", 1)
                graph[name.strip()] = set(uses.split())
    return graph


def design_graph(path, layers):
    graph = {}
    with open(path) as f:
        for line in f:
            m = re.match(r"\| `(\w+)/` \|.*\| ([^|]*) \|\s*$", line)
            if m and m.group(1) in layers:
                graph[m.group(1)] = set(re.findall(r"\w+", m.group(2))) & layers
    return graph


def main():
    cmake = cmake_graph(sys.argv[1])
    design = design_graph(sys.argv[2], set(cmake))
    failures = []
    for layer in sorted(set(cmake) | set(design)):
        if layer not in design:
            failures.append("%s: a layer in CMake, not in design.md's table" % layer)
        elif layer not in cmake:
            failures.append("%s: in design.md's table, not a layer in CMake" % layer)
        elif cmake[layer] != design[layer]:
            failures.append("%s: CMake lets it use %s, design.md says %s" % (
                layer, " ".join(sorted(cmake[layer])) or "nothing",
                " ".join(sorted(design[layer])) or "nothing"))
    for f in failures:
        print(f)
    print("%d layers, %s" % (len(cmake), "the same graph" if not failures else "%d differences" % len(failures)))
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
