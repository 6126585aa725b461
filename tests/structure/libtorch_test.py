#!/usr/bin/env python3
"""Which of collie's binaries load LibTorch, read from what the dynamic loader resolves.

The collie executable, libcollie_app.so, libcollie_core.so and every backend and scheduler
plugin must not: a bench, plugin-check or the lab would otherwise load LibTorch's ~290
libraries in every process, and a plugin's build would depend on the torch version. The
trainer's part, libcollie_torch.so, and the model and codec plugins must (a test that passed because
ldd saw nothing at all would prove nothing).

    libtorch_test.py COLLIE_EXECUTABLE LIB_DIR
"""
import glob
import os
import subprocess
import sys


def loads_libtorch(path):
    out = subprocess.run(["ldd", path], capture_output=True, text=True, check=True).stdout
    if "not found" in out:
        raise SystemExit(f"libtorch: {path}: ldd cannot resolve every library:\n{out}")
    return any(os.path.basename(line.split()[0]).startswith(("libtorch", "libc10"))
               for line in out.splitlines() if line.strip())


def main():
    collie, lib = sys.argv[1], sys.argv[2]
    plugins = os.path.join(lib, "collie")
    without = [collie, os.path.join(lib, "libcollie_app.so")]
    without += glob.glob(os.path.join(lib, "libcollie_core.so.*[0-9]"))[:1]
    without += sorted(glob.glob(os.path.join(plugins, "libcollie_backend_*.so")))
    without += sorted(glob.glob(os.path.join(plugins, "libcollie_scheduler_*.so")))
    with_it = [os.path.join(lib, "libcollie_torch.so")]
    with_it += sorted(glob.glob(os.path.join(plugins, "libcollie_model_*.so")))
    with_it += sorted(glob.glob(os.path.join(plugins, "libcollie_codec_*.so")))
    if len(without) < 6 or len(with_it) < 6:
        raise SystemExit(f"libtorch: too few binaries found under {lib}: {without + with_it}")
    wrong = [p + " loads LibTorch" for p in without if loads_libtorch(p)]
    wrong += [p + " does not load LibTorch" for p in with_it if not loads_libtorch(p)]
    if wrong:
        print("libtorch: " + "; ".join(wrong))
        return 1
    print(f"libtorch: {len(without)} binaries load no LibTorch (the executable, the "
          f"application, the core, every backend and scheduler); {len(with_it)} load it")
    return 0


if __name__ == "__main__":
    sys.exit(main())
