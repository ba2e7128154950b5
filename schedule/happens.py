"""Boxes, cycles and happens-before: the geometry and ordering facts behind the validator's rules.

Happens-before is the transitive closure of counter edges only (placement independent). It is never
computed for the whole program: for one buffer, every task touching it lies in a window [lo, hi] of
program indices, and when program order is topological every path between two of them stays inside
that window. Ancestor bitsets over just the touching tasks are propagated through the window, with
each counter as one join node, so the work is O(window x waits).
"""
from __future__ import annotations

import numpy as np

Box = tuple[tuple[int, int], ...]

PAIR_CHUNK = 1 << 22            # box comparisons per numpy chunk
ROW_CHUNK = 1 << 26             # ancestor bits unpacked at once


def overlap_pairs(alo: np.ndarray, ahi: np.ndarray, blo: np.ndarray, bhi: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(i, j) for every box i of a and box j of b that intersect on every axis. lo, hi: [n, ndim]."""
    ii, jj = [], []
    step = max(1, PAIR_CHUNK // max(1, len(blo) * blo.shape[1]))
    for s in range(0, len(alo), step):
        lo, hi = alo[s:s + step], ahi[s:s + step]
        ov = ((lo[:, None, :] < bhi[None, :, :]) & (blo[None, :, :] < hi[:, None, :])).all(axis=2)
        r, c = np.nonzero(ov)
        ii.append(r + s)
        jj.append(c)
    if not ii:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    return np.concatenate(ii), np.concatenate(jj)


def boxes_meet(a: Box, b: Box) -> bool:
    """Boxes a and b intersect on every axis (overlap_pairs for one pair)."""
    return all(lo1 < hi2 and lo2 < hi1 for (lo1, hi1), (lo2, hi2) in zip(a, b))


def uncovered(box: Box, boxes: list[Box]) -> Box | None:
    """A part of `box` that the union of `boxes` leaves out (None when fully covered)."""
    if any(lo >= hi for lo, hi in box):
        return None
    clipped = [tuple((max(l, bl), min(h, bh)) for (l, h), (bl, bh) in zip(b, box)) for b in boxes]
    clipped = [c for c in clipped if all(l < h for l, h in c)]
    # compress coordinates: every cut on each axis, then one grid cell per slab
    cuts = [sorted({lo, hi} | {x for c in clipped for x in c[ax]}) for ax, (lo, hi) in enumerate(box)]
    index = [{x: k for k, x in enumerate(cut)} for cut in cuts]
    grid = np.zeros([len(c) - 1 for c in cuts], bool)
    for c in clipped:
        grid[tuple(slice(ix[l], ix[h]) for ix, (l, h) in zip(index, c))] = True
    hole = np.argwhere(~grid)
    if not len(hole):
        return None
    return tuple((cuts[ax][k], cuts[ax][k + 1]) for ax, k in enumerate(hole[0]))


def fmt_box(box: Box) -> str:
    return "[" + ", ".join(f"{lo}:{hi}" for lo, hi in box) + "]"


def find_cycles(n_nodes: int, edges: list[tuple[int, int]]) -> list[list[int]]:
    """One cycle (nodes, first repeated last) per strongly connected knot of the graph; [] when
    acyclic. Kahn's algorithm first, so the acyclic case stays linear; networkx only names cycles."""
    succ: list[list[int]] = [[] for _ in range(n_nodes)]
    indeg = [0] * n_nodes
    for a, b in edges:
        succ[a].append(b)
        indeg[b] += 1
    stack = [v for v in range(n_nodes) if indeg[v] == 0]
    while stack:
        v = stack.pop()
        for w in succ[v]:
            indeg[w] -= 1
            if indeg[w] == 0:
                stack.append(w)
    left = [v for v in range(n_nodes) if indeg[v] > 0]
    if not left:
        return []
    import networkx as nx
    g = nx.DiGraph()
    g.add_edges_from((a, b) for a in left for b in succ[a] if indeg[b] > 0)
    cycles = []
    for scc in nx.strongly_connected_components(g):
        sub = g.subgraph(scc)
        if len(scc) > 1 or sub.number_of_edges():
            cyc = nx.find_cycle(sub)
            cycles.append([a for a, _ in cyc] + [cyc[0][0]])
    return sorted(cycles, key=min)


class Ancestry:
    """Which of `members` (sorted task ids touching one buffer) happen before which.

    joins[i]: the counters task i waits for with a full join (threshold >= producers); a partial
    wait says nothing about which producers finished, so it adds no edge. Requires program order
    to be topological (validator rule program_order).
    """

    def __init__(self, members: np.ndarray, joins: list[tuple[int, ...]], producers: list[list[int]]):
        self.members = members
        pos = {t: k for k, t in enumerate(members.tolist())}
        lo, hi = int(members[0]), int(members[-1])
        reach = [0] * (hi - lo + 1)       # ancestors among members, plus the task's own bit
        joined: dict[int, int] = {}       # counter -> members that happen before its waiters
        self.anc = [0] * len(members)     # per member: the members that happen before it
        for i in range(lo, hi + 1):
            a = 0
            for c in joins[i]:
                r = joined.get(c)
                if r is None:
                    r = 0
                    for p in producers[c]:
                        if lo <= p < i:
                            r |= reach[p - lo]
                    joined[c] = r
                a |= r
            k = pos.get(i)
            if k is None:
                reach[i - lo] = a
            else:
                self.anc[k] = a
                reach[i - lo] = a | (1 << k)

    def before(self, a: np.ndarray, b: np.ndarray) -> np.ndarray:
        """ok[n] = task a[n] happens before task b[n] (both members)."""
        ok = np.zeros(len(a), bool)
        k = len(self.members)
        nbytes = (k + 7) // 8
        pa, pb = np.searchsorted(self.members, a), np.searchsorted(self.members, b)
        step = max(1, ROW_CHUNK // (8 * nbytes))
        for s in range(0, k, step):
            sel = np.flatnonzero((pb >= s) & (pb < s + step))
            if not len(sel):
                continue
            # ancestor rows s.. as a bit matrix [rows, k]
            blob = b"".join(x.to_bytes(nbytes, "little") for x in self.anc[s:s + step])
            bits = np.unpackbits(np.frombuffer(blob, np.uint8).reshape(-1, nbytes), axis=1, bitorder="little")
            ok[sel] = bits[pb[sel] - s, pa[sel]].astype(bool)
        return ok
