# Sourced by the benchmarks that run a PyTorch peer beside collie (ddp_peers.sh,
# zero_peers.sh): checks what both need and sets `python`, `collie` and `preload` (the
# libraries both run on: OpenBLAS, and tcmalloc as malloc, which collie links), then prints
# what runs.
python=/usr/bin/python3
collie=build/bin/collie
[[ -x "$collie" ]] || { echo "build collie first: scripts/build.sh" >&2; exit 2; }
command -v torchrun >/dev/null || { echo "torchrun missing: apt-get install python3-torch" >&2; exit 2; }
# awk reads to the end: under pipefail an early exit would kill ldconfig with SIGPIPE.
openblas="$(ldconfig -p | awk '/libopenblas\.so\.0 / && !found {print $NF; found = 1}')"
[[ -n "$openblas" ]] || { echo "OpenBLAS missing: apt-get install libopenblas0-pthread" >&2; exit 2; }
tcmalloc="$(ldconfig -p | awk '/libtcmalloc_minimal\.so\.4 / && !found {print $NF; found = 1}')"
[[ -n "$tcmalloc" ]] || { echo "tcmalloc missing: apt-get install libtcmalloc-minimal4" >&2; exit 2; }
preload="$openblas $tcmalloc"
echo "# collie: $($collie --version | tr '\n' ' ')"
echo "# PyTorch peer: LD_PRELOAD='$preload', torchrun --standalone --redirects 2 --tee 1"
