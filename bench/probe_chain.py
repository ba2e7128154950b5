"""Average the phase times a -DMVM_PROBE_CHAIN=1 build prints (vm/kernel/device.cuh: chain_probe).

Usage: MEGAVM_NVCC_FLAGS=-DMVM_PROBE_CHAIN=1 python3 bench/kernel_time.py --models llama-1b | python3 bench/probe_chain.py
Other lines pass through; one row per probe label (opcode(phases)/key), phases in us, last."""
import re
import sys
from collections import defaultdict

LINE = re.compile(r"CHAIN (\S+) task \d+: ([\d ]+)$")


def main() -> None:
    rows = defaultdict(list)
    for line in sys.stdin:
        m = LINE.match(line.strip())
        if not m:
            print(line, end="")
            continue
        d = [int(x) for x in m.group(2).split()]
        while d and d[-1] == 0:
            d.pop()
        rows[m.group(1)].append(d)
    for label, ds in rows.items():
        n = min(len(d) for d in ds)
        means = [sum(d[i] for d in ds) / len(ds) / 1e3 for i in range(n)]
        print(f"{label:52s} n={len(ds):5d}  us: " + " ".join(f"{m:.2f}" for m in means))


if __name__ == "__main__":
    main()
