#!/usr/bin/env python3
"""SASS of k31 kernels as NVIDIA's Vulkan driver compiled them (run on the benchmark GPU).

For each kernel name: builds the pipeline alone with `shader_stats` (benches/shader_stats.rs)
into a fresh driver shader cache, takes the cache entry's zstd frames apart, finds the code by
the "Binary Size" the driver reported, and disassembles it with `nvdisasm -b SM90`. The cache
layout is the driver's (580.x), not a documented format: a driver that stores it differently
makes this fail loudly, not silently.

    tools/nvidia_sass.py --stats PATH/TO/shader_stats --out DIR [--arch SM90] KERNEL...
    tools/nvidia_sass.py --summarize DIR      (the one-line summaries of DIR/*.sass again)

Each kernel gets a one-line summary: the memory instructions by kind (LDG.E.STRONG.SM: a load
from a binding the kernel also writes; LDL/STL: local memory, usually a spilled or
dynamically indexed private array), barriers, matrix and special-function instructions.

Needs `zstd` and `nvdisasm` on PATH (the device has nvdisasm in /usr/local/cuda/bin).
"""
import argparse
import glob
import os
import re
import shutil
import struct
import subprocess
import sys
import tempfile

ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"


def frames(blob):
    """The zstd frames of a cache entry, decompressed."""
    starts = [m.start() for m in re.finditer(re.escape(ZSTD_MAGIC), blob)]
    out = []
    for i, s in enumerate(starts):
        end = starts[i + 1] if i + 1 < len(starts) else len(blob)
        r = subprocess.run(["zstd", "-d", "-c", "-q"], input=blob[s:end], capture_output=True)
        if r.returncode == 0 and r.stdout:
            out.append(r.stdout)
    return out


def code_of(raw, size):
    """Finds the (size, offset) record of the code section in the header; returns its
    instructions (16 bytes each on sm_90)."""
    want = struct.pack("<I", size)
    for m in re.finditer(re.escape(want), raw[:4096]):
        off = struct.unpack_from("<I", raw, m.start() + 4)[0]
        if 0 < off and off + size <= len(raw):
            # The section starts with 8 bytes (in 580.x: 0) before the first instruction.
            code = raw[off + 8:off + size]
            return code[:len(code) // 16 * 16]
    return None


SUMMARY_KINDS = ("LDG", "STG", "LDS", "STS", "LDL", "STL", "BAR", "HMMA", "MUFU", "FFMA", "SHFL")


def summary(sass):
    """Instruction counts by opcode family and the memory instructions' full forms."""
    ops = re.findall(r"^\s*/\*[0-9a-f]+\*/\s+(?:@!?U?P\w+\s+)?([A-Z][A-Z0-9_.]*)", sass, re.M)
    fam = {}
    forms = {}
    for op in ops:
        base = op.split(".")[0]
        fam[base] = fam.get(base, 0) + 1
        if base in ("LDG", "STG"):
            forms[op] = forms.get(op, 0) + 1
    parts = [f"{fam.get(k, 0)} {k}" for k in SUMMARY_KINDS if fam.get(k)]
    parts += [f"{n} {op}" for op, n in sorted(forms.items())]
    return f"{len(ops)} instructions: " + ", ".join(parts)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--stats", help="the shader_stats binary")
    ap.add_argument("--out")
    ap.add_argument("--arch", default="SM90")
    ap.add_argument("--summarize", help="only summarise the .sass files already in this folder")
    ap.add_argument("kernels", nargs="*")
    a = ap.parse_args()
    if a.summarize:
        for f in sorted(glob.glob(os.path.join(a.summarize, "*.sass"))):
            print(f"{os.path.basename(f)[:-5]}: {summary(open(f).read())}")
        return
    if not (a.stats and a.out and a.kernels):
        ap.error("--stats, --out and at least one kernel are needed (or --summarize DIR)")
    os.makedirs(a.out, exist_ok=True)
    failed = False
    for k in a.kernels:
        cache = tempfile.mkdtemp(prefix="k31glc")
        env = dict(os.environ, __GL_SHADER_DISK_CACHE_PATH=cache, __GL_SHADER_DISK_CACHE_SKIP_CLEANUP="1",
                   __GL_SHADER_DISK_CACHE="1")
        r = subprocess.run([a.stats, "--exact", k], env=env, capture_output=True, text=True)
        line = next((l for l in r.stdout.splitlines() if l.startswith(k + " ")), None)
        m = re.search(r"Binary Size=(\d+)", line or "")
        if not m:
            print(f"{k}: no statistics from shader_stats:\n{r.stdout}{r.stderr}", file=sys.stderr)
            failed = True
            continue
        size = int(m.group(1))
        code = None
        for entry in glob.glob(os.path.join(cache, "**", "*.bin"), recursive=True):
            for raw in frames(open(entry, "rb").read()):
                code = code or code_of(raw, size)
        shutil.rmtree(cache, ignore_errors=True)
        if code is None:
            print(f"{k}: no {size}-byte code section found in the driver cache", file=sys.stderr)
            failed = True
            continue
        binary = os.path.join(a.out, k + ".bin")
        open(binary, "wb").write(code)
        d = subprocess.run(["nvdisasm", "-b", a.arch, binary], capture_output=True, text=True)
        open(os.path.join(a.out, k + ".sass"), "w").write(line + "\n" + d.stdout + d.stderr)
        os.remove(binary)
        print(f"{k}: {size} bytes; {summary(d.stdout)}")
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
