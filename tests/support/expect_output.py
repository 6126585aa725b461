#!/usr/bin/env python3
"""Runs a command for ctest and checks both its exit code and its output.

ctest's PASS_REGULAR_EXPRESSION alone ignores the exit code, so a run that printed the
right lines and then failed would pass. This passes only when the command exits with the
expected code (0 unless --exit says otherwise), every --pass pattern is found in its
output (stdout and stderr together; `.` matches newlines) and no --fail pattern is.

  expect_output.py [--exit N] [--pass REGEX]... [--fail REGEX]... -- COMMAND [ARGS...]
"""
import argparse
import re
import subprocess
import sys

parser = argparse.ArgumentParser()
parser.add_argument("--exit", type=int, default=0)
parser.add_argument("--pass", dest="passes", action="append", default=[])
parser.add_argument("--fail", dest="fails", action="append", default=[])
parser.add_argument("command", nargs=argparse.REMAINDER)
args = parser.parse_args()
command = args.command[1:] if args.command[:1] == ["--"] else args.command
if not command:
    parser.error("no command given")

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
