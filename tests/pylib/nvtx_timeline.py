"""What tests/preload/nvtx_recorder.cc wrote, for lazypin's NVTX domain:
the range names in push order, the markers, whether the ranges nest (never
a pop without its push, none left open), and whether the domain was made."""


def lazypin_timeline(path):
    """(pushes, marks, balanced, created) for the "lazypin" domain in the recording at `path`."""
    with open(path) as f:
        lines = [l.rstrip("\n") for l in f]
    depth, pushes, marks, balanced = 0, [], [], True
    for l in lines:
        kind, _, rest = l.partition(" ")
        domain, _, text = rest.partition(" ")
        if domain != "lazypin":
            continue
        if kind == "push":
            depth += 1
            pushes.append(text)
        elif kind == "pop":
            depth -= 1
            balanced = balanced and depth >= 0
        elif kind == "mark":
            marks.append(text)
    return pushes, marks, balanced and depth == 0, "domain lazypin" in lines
