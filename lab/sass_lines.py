"""Static SASS instructions of a CUDA source's lines: compiled with nvcc (the NVRTC options'
equivalent, ``-lineinfo``, sm_90a), disassembled with nvdisasm (Triton's copy), each
instruction counted for the source line nvdisasm attributes it to (inlined helpers count where
they are defined).  No GPU needed.  From the repository root:

    python -m lab.sass_lines backends/cuda_chunk_prep.cu 303:326 GDN_STORE3=0 GDN_HEADS=1 ...

prints the kernel's total and, per ``FIRST:LAST`` range of lines (LAST excluded), the count and
the commonest opcodes.
"""
from __future__ import annotations

import collections
import re
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from gdnzoo.backends import _cuda_build as cb     # noqa: E402

NVDISASM = Path(__import__("triton").__file__).parent / "backends/nvidia/bin/nvdisasm"


def per_line(source: Path, defs) -> collections.Counter:
    """{(source line, opcode): count} of the kernel's SASS, line None outside ``source``."""
    cubin = Path(tempfile.mkdtemp()) / "k.cubin"
    subprocess.run(["nvcc", *cb.nvcc_args(defs, (9, 0)), "-lineinfo", "--cubin", "-o",
                    str(cubin), str(source)], check=True, capture_output=True, text=True)
    out = subprocess.run([str(NVDISASM), "-g", "-c", str(cubin)], check=True,
                         capture_output=True, text=True).stdout
    counts, line = collections.Counter(), None
    for text in out.splitlines():
        if "//## File" in text:
            m = re.search(r"line (\d+)", text)
            line = int(m.group(1)) if m and source.name in text else None
        elif re.match(r"\s+/\*[0-9a-f]{4}\*/", text):
            op = re.search(r"\*/\s+(?:@!?U?P\w+\s+)?([A-Z0-9_]+)", text)
            counts[line, op.group(1) if op else "?"] += 1
    return counts


def main():
    source = Path(sys.argv[1])
    ranges = [tuple(map(int, a.split(":"))) for a in sys.argv[2:] if ":" in a]
    defs = tuple((k, int(v)) for k, v in (a.split("=") for a in sys.argv[2:] if "=" in a))
    counts = per_line(source, defs)
    print(f"{source} {' '.join(f'{k}={v}' for k, v in defs)}: {sum(counts.values())} "
          f"instructions")
    for lo, hi in ranges:
        ops = collections.Counter()
        for (line, op), n in counts.items():
            if line is not None and lo <= line < hi:
                ops[op] += n
        print(f"  lines {lo}-{hi - 1}: {sum(ops.values())}  " +
              " ".join(f"{op} {n}" for op, n in ops.most_common(10)))


if __name__ == "__main__":
    main()
