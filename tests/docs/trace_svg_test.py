#!/usr/bin/env python3
"""scripts/trace-svg.py on a small job trace whose names hold XML's special characters:
the SVG parses, has a row per rank and track and a box per event of the chosen steps, and
every name arrives as text, not markup. A trace that is not one is refused with exit 1."""
import json
import os
import subprocess
import sys
import tempfile
import xml.etree.ElementTree as ET

SCRIPT = os.path.join(os.path.dirname(__file__), "..", "..", "scripts", "trace-svg.py")
NS = "{http://www.w3.org/2000/svg}"


def event(pid, tid, name, ts, dur, step, cat="compute"):
    return {"name": name, "cat": cat, "ph": "X", "pid": pid, "tid": tid, "ts": ts, "dur": dur,
            "args": {"step": step}}


def main():
    hostile = 'rank 1 (<b>&"host")'
    events = [
        {"name": "process_name", "ph": "M", "pid": 0, "tid": 0, "args": {"name": "rank 0 (a)"}},
        {"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": hostile}},
    ]
    for step in (1, 2, 3):
        for pid in (0, 1):
            base = step * 1000.0
            events.append(event(pid, 1, "step", base, 900, step))
            events.append(event(pid, 1, "forward", base, 300, step))
            events.append(event(pid, 2, "</text><script>x</script>", base + 300, 200, step,
                                "collective"))
    trace = {"traceEvents": events, "otherData": {"experiment": "a<b"}}
    with tempfile.TemporaryDirectory() as tmp:
        path, out = os.path.join(tmp, "trace.json"), os.path.join(tmp, "out.svg")
        with open(path, "w") as f:
            json.dump(trace, f)
        subprocess.run([sys.executable, SCRIPT, path, out, "--steps", "2-3"], check=True)
        root = ET.parse(out).getroot()
        texts = [t.text or "" for t in root.iter(NS + "text")]
        assert any(hostile in t for t in texts), texts
        assert any(t.startswith("a<b steps 2-3") for t in texts), texts
        assert not list(root.iter(NS + "script")), "markup from a name reached the SVG"
        boxes = [r for r in root.iter(NS + "rect") if r.find(NS + "title") is not None]
        assert len(boxes) == 2 * 2 * 3, len(boxes)  # steps 2-3, 2 ranks, 3 events each
        rows = [t for t in texts if t.endswith(" compute") or t.endswith(" communication")]
        assert len(rows) == 4, rows
        with open(path, "w") as f:
            f.write("not json")
        bad = subprocess.run([sys.executable, SCRIPT, path, out], capture_output=True, text=True)
        assert bad.returncode == 1 and "is not a trace-event JSON" in bad.stderr, bad
    print("trace-svg: ok")


if __name__ == "__main__":
    main()
