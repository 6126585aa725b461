# Sourced by the benchmarks that run a PyTorch peer beside collie (ddp_peers.sh,
# zero_peers.sh): checks what both need and sets `python`, `collie` and `preload` (the
# libraries both run on: OpenBLAS, and the malloc collie says it runs on), then prints
# what runs.
python=/usr/bin/python3
collie=build/bin/collie
[[ -x "$collie" ]] || { echo "build collie first: scripts/build.sh" >&2; exit 2; }
command -v torchrun >/dev/null || { echo "torchrun missing: apt-get install python3-torch" >&2; exit 2; }
# awk reads to the end: under pipefail an early exit would kill ldconfig with SIGPIPE.
openblas="$(ldconfig -p | awk '/libopenblas\.so\.0 / && !found {print $NF; found = 1}')"
[[ -n "$openblas" ]] || { echo "OpenBLAS missing: apt-get install libopenblas0-pthread" >&2; exit 2; }
# The malloc collie runs on, as it says itself (tcmalloc where it was built with it); the
# C library's needs no preloading.
malloc="$("$collie" --version | awk '/^malloc: / {print $2}')"
[[ -n "$malloc" ]] || { echo "collie --version names no malloc" >&2; exit 2; }
preload="$openblas"
[[ "$(basename "$malloc")" == libc.* ]] || preload+=" $malloc"
echo "# collie: $($collie --version | tr '\n' ' ')"
echo "# PyTorch peer: LD_PRELOAD='$preload', torchrun --standalone --redirects 2 --tee 1"
