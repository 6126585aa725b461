#!/usr/bin/env bash
# Compiles (syntax only) every collie source that includes LibTorch's headers against
# LibTorch 2.x with CUDA, on this machine without a GPU: the headers come from Debian
# trixie's libtorch-cuda-dev (contrib), unpacked under a scratch folder, never installed.
# The build of record stays Debian bookworm's 1.13; this catches what differs in 2.x's API
# (docs/running.md "GPUs": collie builds against a PyTorch's LibTorch there).
#   scripts/check-torch2.sh [BUILD_DIR]   (default build/, configured by scripts/build.sh)
set -euo pipefail
here=$(cd "$(dirname "$0")/.." && pwd)
build=${1:-$here/build}
scratch=${TMPDIR:-/tmp}/collie-torch2
mirror=http://deb.debian.org/debian
mkdir -p "$scratch"

if [[ ! -d $scratch/root/usr/include/torch ]]; then
  file=$(curl -fsS "$mirror/dists/trixie/contrib/binary-amd64/Packages.xz" | xz -dc |
    awk '/^Package: libtorch-cuda-dev$/ {p = 1} p && /^Filename:/ && !seen {print $2; seen = 1}')
  [[ -n $file ]] || { echo "check-torch2: trixie/contrib has no libtorch-cuda-dev" >&2; exit 1; }
  curl -fsS -o "$scratch/libtorch-cuda-dev.deb" "$mirror/$file"
  dpkg-deb -x "$scratch/libtorch-cuda-dev.deb" "$scratch/root"
fi
include=$scratch/root/usr/include
grep -h "define TORCH_VERSION " -A1 "$include/torch/csrc/api/include/torch/version.h" | tail -1 |
  sed 's/^ */# check-torch2: LibTorch headers /'

cmake -DCMAKE_EXPORT_COMPILE_COMMANDS=ON "$build" >/dev/null
python3 - "$build/compile_commands.json" "$include" "$here" <<'PY'
import json, os, re, shlex, subprocess, sys
commands, include, root = json.load(open(sys.argv[1])), sys.argv[2], sys.argv[3]
api = include + "/torch/csrc/api/include"
uses = re.compile(r'#include [<"](ATen/|torch/|c10/|collie/(model|autocast)\.h|runtime/aten\.h|train/|runtime/device\.h)')
failed, checked = [], 0
for c in commands:
    source = c["file"]
    if not source.startswith(root + "/") or "/tests/" in source:
        continue
    if not uses.search(open(source, errors="replace").read()):
        continue
    args = [a.replace("/usr/include/torch/csrc/api/include", api) for a in shlex.split(c["command"])]
    if "ccache" in os.path.basename(args[0]):
        args = args[1:]
    keep, skip = [], False
    for a in args[1:]:
        if skip:
            skip = False
        elif a == "-o":
            skip = True
        elif a != "-c":
            keep.append(a)
    # 2.x's headers first, before /usr/include's 1.13.
    cmd = [args[0], "-isystem", include, "-isystem", api, "-fsyntax-only"] + keep
    r = subprocess.run(cmd, cwd=c["directory"], capture_output=True, text=True)
    checked += 1
    if r.returncode != 0:
        failed.append(os.path.relpath(source, root))
        errors = [l for l in r.stderr.splitlines() if "error" in l]
        print("\n".join(errors[:10]))
print(f"# check-torch2: {checked} sources, {len(failed)} failed" +
      (": " + ", ".join(failed) if failed else ""))
sys.exit(1 if failed else 0)
PY
