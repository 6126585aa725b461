#!/usr/bin/env python3
"""Writes the SimGrid platform files under configs/platforms/ (backends/simgrid/README.md).

Each file is one SimGrid <cluster> of 4,096 hosts, one rank per host (the simgrid backend
places rank r on the r-th host in natural order, so a smaller job uses the first hosts), with
its rates and latencies in a comment. Run it again after changing a number here:

    scripts/make-platforms.py [OUT_DIR]
"""
import sys
from pathlib import Path

HOSTS = 4096
LINK_GBPS = 100  # every link of every platform below, each direction
LATENCY_US = 1   # per link

PLATFORMS = {
    "fat-tree": (
        "FAT_TREE",
        "2;16,256;1,4;1,1",
        "A 2-level fat tree: 256 leaf switches of 16 hosts, each leaf with 4 uplinks, one to\n"
        "each of 4 top switches. A leaf takes 16 x 100 Gbit/s from its hosts and has 4 x 100\n"
        "Gbit/s up: oversubscribed 4:1. Inside a leaf a route is 2 links (2 us); between leaves\n"
        "it is 4 links (4 us) and shares the leaves' uplinks.",
    ),
    "torus": (
        "TORUS",
        "16,16,16",
        "A 3-D torus of 16 x 16 x 16 hosts, each joined to its 6 neighbours (wrapping around).\n"
        "A route follows the dimensions in order: up to 8 hops per dimension, 24 in all\n"
        "(24 us), and the hops of distant ranks share the links on the way.",
    ),
    "dragonfly": (
        "DRAGONFLY",
        "8,4;8,3;8,1;8",
        "A dragonfly: 8 groups of 8 chassis of 8 routers of 8 hosts. Routers of a chassis are\n"
        "joined all to all (green links, 1 each), chassis of a group all to all (black links,\n"
        "3 each), groups all to all (blue links, 4 each). A route takes up to 6 links (6 us).",
    ),
}


def platform(topology: str, parameters: str, comment: str) -> str:
    lines = "\n".join("  " + line for line in comment.splitlines())
    return (
        "<?xml version='1.0'?>\n"
        '<!DOCTYPE platform SYSTEM "https://simgrid.org/simgrid.dtd">\n'
        f"<!-- Written by scripts/make-platforms.py: edit it there.\n{lines}\n"
        f"  {HOSTS} hosts; every link {LINK_GBPS} Gbit/s each way (full duplex) and {LATENCY_US}"
        " us. -->\n"
        '<platform version="4.1">\n'
        f'  <cluster id="{topology.lower()}" prefix="host" radical="0-{HOSTS - 1}" suffix=""'
        f' speed="1Gf" bw="{LINK_GBPS}Gbps" lat="{LATENCY_US}us" sharing_policy="SPLITDUPLEX"\n'
        f'           topology="{topology}" topo_parameters="{parameters}"/>\n'
        "</platform>\n"
    )


def main() -> None:
    out = Path(sys.argv[1]) if len(sys.argv) > 1 else Path(__file__).parent.parent / "configs/platforms"
    out.mkdir(parents=True, exist_ok=True)
    for name, (topology, parameters, comment) in PLATFORMS.items():
        (out / f"{name}.xml").write_text(platform(topology, parameters, comment))
        print(out / f"{name}.xml")


if __name__ == "__main__":
    main()
