#!/usr/bin/env python3
"""Runs a command for ctest and checks both its exit code and its output.

ctest's PASS_REGULAR_EXPRESSION alone ignores the exit code, so a run that printed the
right lines and then failed would pass. This passes only when the command exits with the
expected code (0 unless --exit says otherwise), every --pass pattern is found in its
output (stdout and stderr together; `.` matches newlines) and no --fail pattern is. With
--needs it first checks that this machine has what the command needs, and exits 77 (ctest's
SKIP_RETURN_CODE) with a line saying what is missing when it does not.

  expect_output.py [--exit N] [--needs lab|cpu-controller|memory-controller] [--pass REGEX]...
                   [--fail REGEX]...
                   -- COMMAND [ARGS...]
"""
import argparse
import os
import re
import subprocess
import sys


def missing_controller(controller, key):
    """What `key` (launch.cpu_share, launch.memory_limit) lacks here ("" when nothing): root,
    and a cgroup v1 hierarchy with the `controller` option or a cgroup2 one whose
    cgroup.controllers lists it (as runtime/cgroup.cc looks for them)."""
    if os.geteuid() != 0:
        return f"{key} needs root to make cgroups (running as uid {os.geteuid()})"
    unified = ""
    with open("/proc/self/mountinfo") as mounts:
        for line in mounts:
            fields = line.split()
            dash = fields.index("-") if "-" in fields else len(fields)
            if len(fields) < 5 or len(fields) - dash < 4:
                continue
            if fields[dash + 1] == "cgroup" and controller in fields[dash + 3].split(","):
                return ""
            if fields[dash + 1] == "cgroup2":
                unified = fields[4]
    if unified and os.path.isfile(os.path.join(unified, "cgroup.controllers")):
        with open(os.path.join(unified, "cgroup.controllers")) as controllers:
            if controller in controllers.read().split():
                return ""
    return (f"{key} needs the cgroup {controller} controller: no cgroup v1 hierarchy with the "
            f"{controller} option in /proc/self/mountinfo, and no cgroup2 hierarchy whose "
            f"cgroup.controllers lists {controller}")


def missing_lab():
    """What launch.lab lacks here ("" when nothing): root, and iproute2's ip."""
    if os.geteuid() != 0:
        return f"launch.lab needs root to make network namespaces (running as uid {os.geteuid()})"
    if not any(os.access(os.path.join(d, "ip"), os.X_OK) for d in ("/usr/sbin", "/sbin", "/usr/bin", "/bin")):
        return "launch.lab needs iproute2's ip (apt-get install iproute2)"
    return ""


NEEDS = {
    "lab": missing_lab,
    "cpu-controller": lambda: missing_controller("cpu", "launch.cpu_share"),
    "memory-controller": lambda: missing_controller("memory", "launch.memory_limit"),
}

parser = argparse.ArgumentParser()
parser.add_argument("--exit", type=int, default=0)
parser.add_argument("--pass", dest="passes", action="append", default=[])
parser.add_argument("--fail", dest="fails", action="append", default=[])
parser.add_argument("--needs", action="append", default=[], choices=sorted(NEEDS))
parser.add_argument("command", nargs=argparse.REMAINDER)
args = parser.parse_args()
command = args.command[1:] if args.command[:1] == ["--"] else args.command
if not command:
    parser.error("no command given")
for need in args.needs:
    missing = NEEDS[need]()
    if missing:
        print(f"expect_output: SKIP: {missing}")
        sys.exit(77)

run = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
output = run.stdout.decode("utf-8", errors="replace")
sys.stdout.write(output)
problems = []
if run.returncode != args.exit:
    problems.append(f"exit code {run.returncode}, expected {args.exit}")
for pattern in args.passes:
    if not re.search(pattern, output, re.S):
        problems.append(f"output lacks /{pattern}/")
for pattern in args.fails:
    match = re.search(pattern, output, re.S)
    if match:
        problems.append(f"output has /{pattern}/: ...{output[max(0, match.start() - 60):match.end() + 60]}...")
for p in problems:
    print(f"expect_output: FAIL: {p}")
sys.exit(1 if problems else 0)
