"""Memory a request may take, checked before it is taken: what the machine can give now, and one
refusal naming the figure, its parts and the limit."""
from __future__ import annotations

import os

from megavm.core.errors import UserError

GiB = float(1 << 30)


def host_bytes_available() -> int:
    """Memory the OS can give this process now (MemAvailable), else the machine's physical memory."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):
        return 1 << 62


def require(what: str, parts: dict[str, int], available: int, where: str) -> None:
    """UserError when the parts (name -> bytes) of `what` add up to more than `available`."""
    need = sum(parts.values())
    if need > available:
        big = ", ".join(f"{k} {v / GiB:.2f}" for k, v in sorted(parts.items(), key=lambda kv: -kv[1]) if v >= GiB / 100)
        raise UserError(f"{what} needs {need / GiB:.2f} GiB of {where}{f' ({big} GiB)' if big else ''}, more than "
                        f"the {available / GiB:.2f} GiB available")


def program_bytes(packed, kinds) -> int:
    """Bytes of the packed program's buffers of these kinds (megavm.core.types.BufferKind values)."""
    return int(sum(int(r["nbytes"]) for r in packed.buffers if int(r["kind"]) in set(int(k) for k in kinds)))
