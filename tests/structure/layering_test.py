#!/usr/bin/env python3
"""The layers of collie, read from the includes, so that they stay what
docs/architecture.md says:

    contract (framework/include/collie) <- core <- {config, plugin, util} <- runtime
        <- measure <- {bench, check, train, lab} <- cli

A folder of framework/src may include its own files and those of lower layers; config,
plugin and util may include each other; the kinds (bench, check, train) and the lab may
not include each other. Plugins (plugins/, backends/, models/, codecs/) include only the contract
(`collie/...`, with the patterns and schedules helpers under it).

KNOWN lists the includes that break these rules today, each with why it is still there:
the test fails on any other, and on a KNOWN one that is gone (so the list only shrinks).
Exit 0 when the tree keeps the rules; 1 listing what breaks them.

    layering_test.py REPO_ROOT
"""
import pathlib
import re
import sys

LAYERS = {
    "core": 1,
    "config": 2, "plugin": 2, "util": 2,
    "runtime": 3,
    "measure": 3.5,
    "bench": 4, "check": 4, "train": 4, "lab": 4,
    "cli": 5,
}
SAME_LAYER_OK = {"config", "plugin", "util"}

# (from folder, to folder): why it is still there.
KNOWN = {}

INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"', re.MULTILINE)


def sources(folder):
    for path in sorted(folder.rglob("*")):
        if path.suffix in (".h", ".cc", ".cpp") and path.is_file():
            yield path


def main(root):
    src = root / "framework" / "src"
    broken, seen_known = [], set()
    for path in sources(src):
        mine = path.relative_to(src).parts[0]
        if mine not in LAYERS:
            broken.append(f"{path.relative_to(root)}: folder '{mine}' has no layer in this test")
            continue
        for target in INCLUDE.findall(path.read_text(encoding="utf-8", errors="replace")):
            theirs = target.split("/")[0]
            if "/" not in target or theirs == "collie" or theirs == mine:
                continue  # a header beside it, the contract, or its own folder
            if theirs not in LAYERS:
                continue  # a generated or third-party header
            upward = LAYERS[theirs] > LAYERS[mine]
            sideways = LAYERS[theirs] == LAYERS[mine] and mine not in SAME_LAYER_OK
            if not upward and not sideways:
                continue
            if (mine, theirs) in KNOWN:
                seen_known.add((mine, theirs))
                continue
            direction = "up" if upward else "sideways"
            broken.append(f"{path.relative_to(root)} includes \"{target}\": {mine} (layer "
                          f"{LAYERS[mine]}) reaches {direction} to {theirs} (layer {LAYERS[theirs]})")
    for folder in ("plugins", "backends", "models", "codecs"):
        for path in sources(root / folder):
            for target in INCLUDE.findall(path.read_text(encoding="utf-8", errors="replace")):
                if "/" in target and not target.startswith("collie/"):
                    broken.append(f"{path.relative_to(root)} includes \"{target}\": a plugin "
                                  "includes only the contract (collie/...) and its own files")
    for gone in sorted(set(KNOWN) - seen_known):
        broken.append(f"KNOWN lists {gone[0]} -> {gone[1]}, which no include makes any more: "
                      "remove it from the list")
    if broken:
        print("layering: " + str(len(broken)) + " include(s) break the layers:")
        for line in broken:
            print("  " + line)
        return 1
    print(f"layering: framework/src keeps its layers ({len(KNOWN)} known exceptions), "
          "plugins include only the contract")
    return 0


if __name__ == "__main__":
    sys.exit(main(pathlib.Path(sys.argv[1]).resolve()))
