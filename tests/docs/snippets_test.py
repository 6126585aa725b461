#!/usr/bin/env python3
"""Every C++ or CMake snippet in the docs is code that builds.

Each ```cpp / ```cmake block of a Markdown file must follow a line
`<!-- snippet: PATH -->` naming a source file of the repository (compiled by the build or
by the install test), and its lines must appear in that file as they are, consecutively.
Exit 0 when all do; 1 listing the blocks that do not.
"""
import pathlib
import re
import sys

root = pathlib.Path(sys.argv[1]).resolve()
fence = re.compile(r"^```(cpp|c\+\+|cmake)\s*$")
marker = re.compile(r"^<!-- snippet: (\S+) -->$")
failures, checked = [], 0

for md in sorted(root.rglob("*.md")):
    if any(part in ("build", ".git") or part.startswith("build") for part in md.relative_to(root).parts):
        continue
    lines = md.read_text(encoding="utf-8").splitlines()
    i = 0
    while i < len(lines):
        if not fence.match(lines[i]):
            i += 1
            continue
        start = i
        j = i + 1
        while j < len(lines) and lines[j] != "```":
            j += 1
        block = [l.rstrip() for l in lines[start + 1 : j]]
        where = f"{md.relative_to(root)}:{start + 1}"
        previous = next((l for l in reversed(lines[:start]) if l.strip()), "")
        m = marker.match(previous.strip())
        checked += 1
        if not m:
            failures.append(f"{where}: no `<!-- snippet: PATH -->` line names the file it is from")
        else:
            source = root / m.group(1)
            if not source.is_file():
                failures.append(f"{where}: {m.group(1)} does not exist")
            else:
                text = [l.rstrip() for l in source.read_text(encoding="utf-8").splitlines()]
                n = len(block)
                if n == 0 or not any(text[k : k + n] == block for k in range(len(text) - n + 1)):
                    failures.append(f"{where}: the block is not a verbatim excerpt of {m.group(1)}")
        i = j + 1

for f in failures:
    print("FAIL", f)
print(f"{checked} snippet(s) checked, {len(failures)} failed")
sys.exit(1 if failures or checked == 0 else 0)
