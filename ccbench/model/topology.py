"""Network topologies for the simulator: nodes, directed links, routes.

Nodes 0..P-1 are the ranks (NPUs); switches come after them. Every directed link has
a bandwidth (bytes/s, 1/beta), a per-message latency class alpha (seconds; a message
pays the largest alpha on its path once, the endpoint/software cost the fit measured)
and a per-hop latency (seconds, default 0: the fit's alpha already holds it).

Spec syntax (`--topology`):

    ring:P                      bidirectional ring, shorter direction
    fully-connected:P           one link per ordered pair
    switch:P                    star: every rank to one switch (2 hops)
    fat-tree:P[:leaf=L][:oversub=O][:uplink=R]
                                two levels: leaves of L ranks (default 16), leaf uplinks
                                to the spine aggregated with L x bw / O (default O=1);
                                uplink=R: bw of the uplinks' L x bw / O is R (bits/s of
                                payload, K/M/G) instead of the rank's fitted 1/beta (a
                                fitted beta carries the endpoint's costs, a spine link
                                does not)
    torus:XxY | torus:XxYxZ     2D/3D torus, dimension-order routing, shorter direction
    hypercube:P                 P a power of two, e-cube routing
    dual-plane:P[:gpus=8][:tor=16][:oversub=1]
                                hosts of `gpus` ranks on an intra-host switch (intra
                                link class); each rank's NIC has two ports to two ToR
                                switches in two planes; `tor` hosts per ToR; ToRs of a
                                plane meet at a spine (uplinks L x bw / oversub). An
                                inter-host message is split in half over the two planes.

A bare P (`--ranks P`) fills in P when the spec omits it (`ring` = `ring:P`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from ccbench.errors import UsageError, choices_error
from ccbench.units import bits_per_second

KINDS = ("ring", "fully-connected", "switch", "fat-tree", "torus", "hypercube", "dual-plane")

__all__ = ["KINDS", "LinkClass", "Paths", "Topology", "parse_topology", "build_topology"]


@dataclass(frozen=True, slots=True)
class Paths:
    """Routes of many messages at once, as arrays.

    A message split over several paths (dual-plane) has one subflow per path. Row i of
    `links` lists the link ids of subflow i, -1 where the path is shorter than the row.
    """

    msg: np.ndarray       # message index of each subflow
    links: np.ndarray     # (subflows, longest path) link ids, -1 padded
    frac: np.ndarray      # share of the message's bytes on each subflow
    single: bool = False  # one subflow per message, subflow i = message i


@dataclass(frozen=True, slots=True)
class LinkClass:
    alpha: float          # seconds per message
    beta: float           # seconds per byte (1 / bandwidth)
    hop_latency: float = 0.0


@dataclass
class Topology:
    kind: str
    ranks: int
    spec: str
    num_nodes: int = 0
    cap: list[float] = field(default_factory=list)      # bytes / s per link
    alpha: list[float] = field(default_factory=list)
    hop: list[float] = field(default_factory=list)
    klass: list[str] = field(default_factory=list)
    link_ids: dict[tuple[int, int], int] = field(default_factory=dict)
    dims: list[tuple[str, int]] = field(default_factory=list)   # (ASTRA-sim kind, npus)
    params: dict[str, int | float] = field(default_factory=dict)
    _routes: dict[tuple[int, int], list[tuple[list[int], float]]] = field(default_factory=dict)
    _inter: LinkClass | None = None
    _tables: dict[str, np.ndarray] = field(default_factory=dict)
    _orbits: dict[str, np.ndarray] = field(default_factory=dict)

    # -- construction -------------------------------------------------------------------
    def add_link(self, u: int, v: int, lc: LinkClass, name: str, scale: float = 1.0) -> int:
        key = (u, v)
        if key in self.link_ids:
            return self.link_ids[key]
        self.link_ids[key] = len(self.cap)
        self.cap.append(scale / lc.beta if lc.beta > 0 else math.inf)
        self.alpha.append(lc.alpha)
        self.hop.append(lc.hop_latency)
        self.klass.append(name)
        return self.link_ids[key]

    def add_pair(self, u: int, v: int, lc: LinkClass, name: str, scale: float = 1.0) -> None:
        self.add_link(u, v, lc, name, scale)
        self.add_link(v, u, lc, name, scale)

    def link(self, u: int, v: int) -> int:
        return self.link_ids[(u, v)]

    # -- routing ------------------------------------------------------------------------
    def routes(self, src: int, dst: int) -> list[tuple[list[int], float]]:
        """Paths (link ids) from src to dst with the fraction of the bytes each carries."""
        key = (src, dst)
        r = self._routes.get(key)
        if r is None:
            r = self._routes[key] = self._route(src, dst)
        return r

    def _path(self, nodes: list[int]) -> list[int]:
        return [self.link(a, b) for a, b in zip(nodes, nodes[1:], strict=False)]

    def _route(self, src: int, dst: int) -> list[tuple[list[int], float]]:
        if src == dst:
            return [([], 1.0)]
        route = _ROUTES.get(self.kind)
        if route is None:
            raise choices_error("topology", self.kind, KINDS)
        return route(self, src, dst)

    def _ring_route(self, src: int, dst: int) -> list[tuple[list[int], float]]:
        p = self.ranks
        fwd = (dst - src) % p
        step = 1 if fwd <= p - fwd else -1
        nodes = [src]
        while nodes[-1] != dst:
            nodes.append((nodes[-1] + step) % p)
        return [(self._path(nodes), 1.0)]

    def _fully_connected_route(self, src: int, dst: int) -> list[tuple[list[int], float]]:
        assert self._inter is not None           # links made on first use (p^2 of them)
        return [([self.add_link(src, dst, self._inter, "net")], 1.0)]

    def _switch_route(self, src: int, dst: int) -> list[tuple[list[int], float]]:
        return [(self._path([src, self.ranks, dst]), 1.0)]

    def _fat_tree_route(self, src: int, dst: int) -> list[tuple[list[int], float]]:
        p, leaf = self.ranks, int(self.params["leaf"])
        ls, ld = p + src // leaf, p + dst // leaf
        if ls == ld:
            return [(self._path([src, ls, dst]), 1.0)]
        spine = int(self.params["spine"])
        return [(self._path([src, ls, spine, ld, dst]), 1.0)]

    def _hypercube_route(self, src: int, dst: int) -> list[tuple[list[int], float]]:
        nodes, cur, diff, bit = [src], src, src ^ dst, 0
        while diff:
            if diff & 1:
                cur ^= 1 << bit
                nodes.append(cur)
            diff >>= 1
            bit += 1
        return [(self._path(nodes), 1.0)]

    def _torus_route(self, src: int, dst: int) -> list[tuple[list[int], float]]:
        shape = [n for _, n in self.dims]
        coord: list[int] = [int(x) for x in np.unravel_index(src, shape)]
        goal = [int(x) for x in np.unravel_index(dst, shape)]
        nodes = [src]
        for d, n in enumerate(shape):
            fwd = (goal[d] - coord[d]) % n
            step = 1 if fwd <= n - fwd else -1
            while coord[d] != goal[d]:
                coord[d] = (coord[d] + step) % n
                nodes.append(int(np.ravel_multi_index(coord, shape)))
        return [(self._path(nodes), 1.0)]

    def _dual_plane_route(self, src: int, dst: int) -> list[tuple[list[int], float]]:
        g, tor = int(self.params["gpus"]), int(self.params["tor"])
        hs, hd = src // g, dst // g
        if hs == hd:
            host_switch = int(self.params["host_base"]) + hs
            return [(self._path([src, host_switch, dst]), 1.0)]
        out = []
        ntor = int(self.params["tors_per_plane"])
        for plane in (0, 1):
            base = int(self.params["tor_base"]) + plane * ntor
            ts, td = base + hs // tor, base + hd // tor
            if ts == td:
                nodes = [src, ts, dst]
            else:
                nodes = [src, ts, int(self.params["spine_base"]) + plane, td, dst]
            out.append((self._path(nodes), 0.5))
        return out

    # -- vectorised routing (one call per round of a schedule) ---------------------------
    def paths(self, src: np.ndarray, dst: np.ndarray) -> Paths:
        """The routes of messages src[i] -> dst[i], the same links as `routes`, computed
        with numpy for every kind but fully-connected (whose links are made on first use)."""
        src = np.asarray(src, np.int64)
        dst = np.asarray(dst, np.int64)
        if self.kind == "fully-connected":
            return self._paths_scalar(src, dst)
        tab = self._link_tables()
        k = self.kind
        if k == "switch":
            return _single(np.stack([tab["up"][src], tab["down"][dst]], axis=1), src == dst)
        if k == "fat-tree":
            leaf = int(self.params["leaf"])
            ls, ld = src // leaf, dst // leaf
            cross = ls != ld
            links = np.stack([tab["up"][src], np.where(cross, tab["leaf_up"][ls], -1),
                              np.where(cross, tab["leaf_down"][ld], -1), tab["down"][dst]],
                             axis=1)
            return _single(links, src == dst)
        if k == "ring":
            return _single(self._ring_columns(src, dst, self.ranks, tab["next"], tab["prev"],
                                              1, src.copy()), src == dst)
        if k == "torus":
            shape = [n for _, n in self.dims]
            strides = [int(np.prod(shape[d + 1:])) for d in range(len(shape))]
            node = src.copy()
            cols: list[np.ndarray] = []
            for d, n in enumerate(shape):
                if n == 1:
                    continue
                part = self._ring_columns((src // strides[d]) % n, (dst // strides[d]) % n, n,
                                          tab[f"plus{d}"], tab[f"minus{d}"], strides[d], node)
                cols.append(part.T)
            links = np.concatenate(cols).T if cols else np.full((src.size, 0), -1, np.int64)
            return _single(links, src == dst)
        if k == "hypercube":
            diff = src ^ dst
            cur = src.copy()
            cols = []
            for bit in range(max(0, self.ranks.bit_length() - 1)):
                on = (diff >> bit) & 1 == 1
                cols.append(np.where(on, tab[f"cube{bit}"][cur], -1))
                cur = np.where(on, cur ^ (1 << bit), cur)
            return _single(_stack(cols, src.size), src == dst)
        if k == "dual-plane":
            return self._paths_dual_plane(src, dst, tab)
        raise choices_error("topology", k, KINDS)

    def _ring_columns(self, a: np.ndarray, b: np.ndarray, n: int, plus: np.ndarray,
                      minus: np.ndarray, stride: int, node: np.ndarray) -> np.ndarray:
        """Links walked from coordinate a to b on a ring of n (shorter direction, ties
        forward), one row per message; `node` holds the current node ids and is moved to
        coordinate b in place. Hop j leaves coordinate a + j x step, so all hops are
        computed at once (hops x messages) without walking."""
        fwd = (b - a) % n
        forward = fwd <= n - fwd
        hops = np.where(forward, fwd, n - fwd)
        longest = int(hops.max()) if hops.size else 0
        base = node - a * stride
        step = np.where(forward, 1, -1)
        j = np.arange(longest)[:, None]
        nodes = base + ((a + step * j) % n) * stride
        cols = np.where(forward, plus[nodes], minus[nodes])
        cols[j >= hops] = -1
        node += (b - a) * stride
        return cols.T

    def _paths_dual_plane(self, src: np.ndarray, dst: np.ndarray,
                          tab: dict[str, np.ndarray]) -> Paths:
        g, tor = int(self.params["gpus"]), int(self.params["tor"])
        hs, hd = src // g, dst // g
        local = hs == hd
        loc = np.flatnonzero(local & (src != dst))
        far = np.flatnonzero(~local)
        msgs = [loc]
        rows = [np.stack([tab["intra_up"][src[loc]], tab["intra_down"][dst[loc]],
                          np.full(loc.size, -1), np.full(loc.size, -1)], axis=1)]
        fracs = [np.ones(loc.size)]
        ts, td = hs[far] // tor, hd[far] // tor
        cross = ts != td
        for plane in (0, 1):
            up = tab.get(f"tor_up{plane}")
            down = tab.get(f"tor_down{plane}")
            rows.append(np.stack([
                tab[f"nic_up{plane}"][src[far]],
                np.where(cross, up[ts] if up is not None else -1, -1),
                np.where(cross, down[td] if down is not None else -1, -1),
                tab[f"nic_down{plane}"][dst[far]]], axis=1))
            msgs.append(far)
            fracs.append(np.full(far.size, 0.5))
        same = np.flatnonzero(src == dst)
        msgs.append(same)
        rows.append(np.full((same.size, 4), -1, np.int64))
        fracs.append(np.ones(same.size))
        return Paths(np.concatenate(msgs), np.concatenate(rows).astype(np.int64),
                     np.concatenate(fracs))

    def _paths_scalar(self, src: np.ndarray, dst: np.ndarray) -> Paths:
        msg, rows, frac = [], [], []
        for i, (s, d) in enumerate(zip(src.tolist(), dst.tolist(), strict=True)):
            for links, f in self.routes(s, d):
                msg.append(i)
                rows.append(links)
                frac.append(f)
        width = max((len(r) for r in rows), default=0)
        out = np.full((len(rows), width), -1, np.int64)
        for i, r in enumerate(rows):
            out[i, :len(r)] = r
        return Paths(np.asarray(msg, np.int64), out, np.asarray(frac, float))

    def _link_tables(self) -> dict[str, np.ndarray]:
        """Per-node link id arrays, built once from `link_ids` (-1 where a link is absent)."""
        if self._tables:
            return self._tables
        p, k, tab = self.ranks, self.kind, self._tables
        ids = self.link_ids

        def table(pairs: list[tuple[int, int]]) -> np.ndarray:
            return np.asarray([ids.get(pair, -1) for pair in pairs], np.int64)

        ranks = range(p)
        if k == "switch":
            tab["up"], tab["down"] = table([(r, p) for r in ranks]), table([(p, r) for r in ranks])
        elif k == "fat-tree":
            leaf, spine = int(self.params["leaf"]), int(self.params["spine"])
            leaves = range(p, spine)
            tab["up"] = table([(r, p + r // leaf) for r in ranks])
            tab["down"] = table([(p + r // leaf, r) for r in ranks])
            tab["leaf_up"] = table([(x, spine) for x in leaves])
            tab["leaf_down"] = table([(spine, x) for x in leaves])
        elif k == "ring":
            tab["next"] = table([(r, (r + 1) % p) for r in ranks])
            tab["prev"] = table([(r, (r - 1) % p) for r in ranks])
        elif k == "torus":
            shape = [n for _, n in self.dims]
            coords = np.array(np.unravel_index(np.arange(p), shape))
            for d, n in enumerate(shape):
                for name, step in ((f"plus{d}", 1), (f"minus{d}", -1)):
                    nxt = coords.copy()
                    nxt[d] = (nxt[d] + step) % n
                    peers = np.ravel_multi_index(tuple(nxt), shape).tolist()
                    tab[name] = table(list(zip(ranks, peers, strict=True)))
        elif k == "hypercube":
            for bit in range(max(0, p.bit_length() - 1)):
                tab[f"cube{bit}"] = table([(r, r ^ (1 << bit)) for r in ranks])
        elif k == "dual-plane":
            g, tor = int(self.params["gpus"]), int(self.params["tor"])
            hb, tb = int(self.params["host_base"]), int(self.params["tor_base"])
            sb, ntor = int(self.params["spine_base"]), int(self.params["tors_per_plane"])
            tab["intra_up"] = table([(r, hb + r // g) for r in ranks])
            tab["intra_down"] = table([(hb + r // g, r) for r in ranks])
            for plane in (0, 1):
                tors = [tb + plane * ntor + (r // g) // tor for r in ranks]
                tab[f"nic_up{plane}"] = table(list(zip(ranks, tors, strict=True)))
                tab[f"nic_down{plane}"] = table(list(zip(tors, ranks, strict=True)))
                if ntor > 1:
                    own = [tb + plane * ntor + t for t in range(ntor)]
                    tab[f"tor_up{plane}"] = table([(x, sb + plane) for x in own])
                    tab[f"tor_down{plane}"] = table([(sb + plane, x) for x in own])
        return tab

    def xor_orbits(self) -> tuple[np.ndarray, np.ndarray] | None:
        """Link orbits under the group of rank relabellings r -> r XOR t, when every such
        relabelling is an automorphism of this topology (p and every block size powers of
        two): (orbit id of each link, size of each orbit), else None.

        A round whose traffic the same relabellings map onto itself (rank r sends to
        r XOR s, every rank alike) then has every rank's flows alike, and each link of
        an orbit carries p x (the representative's uses of the orbit) / (orbit size)
        flows; ccbench.model.netsim solves that quotient instead of p flows."""
        if self._orbits:
            return self._orbits["orbit"], self._orbits["size"]
        p = self.ranks

        def pow2(n: int) -> bool:
            return n >= 1 and n & (n - 1) == 0

        role: dict[int, int] = {}
        k = self.kind
        if not pow2(p) or k not in ("switch", "hypercube", "fat-tree", "dual-plane"):
            return None
        if k == "fat-tree":
            if not pow2(int(self.params["leaf"])):
                return None
            role = {int(self.params["spine"]): 2}
        elif k == "dual-plane":
            g, tor = int(self.params["gpus"]), int(self.params["tor"])
            if not (pow2(g) and pow2(tor)):
                return None
            ntor = int(self.params["tors_per_plane"])
            tb, sb = int(self.params["tor_base"]), int(self.params["spine_base"])
            role = {tb + t: 2 + t // ntor for t in range(2 * ntor)}
            role.update({sb: 4, sb + 1: 5})
        keys = []
        for (u, v), _ in sorted(self.link_ids.items(), key=lambda kv: kv[1]):
            ru = 0 if u < p else role.get(u, 1)
            rv = 0 if v < p else role.get(v, 1)
            keys.append((ru, rv, u ^ v if k == "hypercube" else 0))
        _, orbit = np.unique(np.asarray(keys, np.int64), axis=0, return_inverse=True)
        orbit = orbit.ravel().astype(np.int64)
        self._orbits.update(orbit=orbit, size=np.bincount(orbit))
        return self._orbits["orbit"], self._orbits["size"]

    # -- summaries for the analytical model ---------------------------------------------
    def path_cost(self, src: int, dst: int) -> tuple[float, float]:
        """(alpha + hop latencies, seconds per byte) of one uncontended message."""
        alpha, beta = 0.0, 0.0
        for links, frac in self.routes(src, dst):
            if not links:
                continue
            alpha = max(alpha, max(self.alpha[i] for i in links) + sum(self.hop[i] for i in links))
            bottleneck = min(self.cap[i] for i in links)
            # a split message finishes when its slowest part does
            beta = max(beta, frac / bottleneck)
        return alpha, beta

    def flat_parameters(self, pairs: list[tuple[int, int]] | None = None) -> tuple[float, float]:
        """alpha, beta of the worst uncontended pair: the congestion-unaware flat view.

        By default a sample of pairs (0, j): neighbours, powers of two, the middle, the far
        corner of a torus and 16 evenly spaced ranks; that reaches every link class of the
        topologies here (hop latencies are 0 unless asked for, so route length rarely
        matters).
        """
        p = self.ranks
        if pairs is None:
            js = {1, p - 1, p // 2}
            js.update(1 << i for i in range(max(1, p.bit_length())))
            js.update(int(x) for x in np.linspace(1, p - 1, 16))
            if self.kind == "torus":
                shape = [n for _, n in self.dims]
                js.add(int(np.ravel_multi_index([n // 2 for n in shape], shape)))
            pairs = [(0, j) for j in sorted(js) if 0 < j < p]
        if p == 1:
            return 0.0, 0.0
        alpha = beta = 0.0
        for s, d in pairs:
            a, b = self.path_cost(s, d)
            alpha, beta = max(alpha, a), max(beta, b)
        return alpha, beta

    def describe(self) -> str:
        classes = sorted(set(self.klass))
        parts = []
        for c in classes:
            i = self.klass.index(c)
            parts.append(f"{c}: {self.cap[i] / 1e9:.3g} GB/s, alpha {self.alpha[i] * 1e6:.3g} us")
        return f"{self.spec} ({self.ranks} ranks, {len(self.cap)} links; {'; '.join(parts)})"


def _stack(cols: list[np.ndarray], rows: int) -> np.ndarray:
    return np.stack(cols, axis=1) if cols else np.full((rows, 0), -1, np.int64)


def _single(links: np.ndarray, same: np.ndarray) -> Paths:
    """One path per message; a message to itself crosses no link."""
    if same.any():
        links = np.where(same[:, None], -1, links)
    n = links.shape[0]
    return Paths(np.arange(n, dtype=np.int64), links.astype(np.int64, copy=False), np.ones(n),
                 single=True)


def parse_topology(spec: str, ranks: int | None = None) -> tuple[str, list[str], dict[str, str]]:
    parts = [x.strip() for x in spec.split(":") if x.strip()]
    if not parts:
        raise UsageError("empty --topology (examples: ring:8, fat-tree:1024:oversub=2, torus:4x4)")
    kind = parts[0].lower().replace("_", "-")
    kind = {"fc": "fully-connected", "fullyconnected": "fully-connected", "star": "switch",
            "fattree": "fat-tree", "dualplane": "dual-plane", "torus2d": "torus",
            "torus3d": "torus"}.get(kind, kind)
    if kind not in KINDS:
        raise choices_error("topology", parts[0], KINDS)
    positional = [x for x in parts[1:] if "=" not in x]
    options = dict(x.split("=", 1) for x in parts[1:] if "=" in x)
    if not positional and ranks is not None:
        positional = [str(ranks)]
    return kind, positional, options


def _rate_bytes(text: str) -> float:
    """'95.6M' (bits per second, decimal K/M/G) -> bytes per second."""
    bits = bits_per_second(text, "uplink rate")
    if bits <= 0:
        raise UsageError(f"uplink rate {text!r} must be above 0 (bits per second: 95.6M, 10G)")
    return bits / 8


def _int(value: str, what: str) -> int:
    try:
        out = int(value)
    except ValueError:
        raise UsageError(f"malformed {what} {value!r}: need an integer") from None
    if out < 1:
        raise UsageError(f"{what} must be >= 1, got {out}")
    return out


def _rank_count(kind: str, positional: list[str], spec: str) -> tuple[int, list[int]]:
    """The spec's rank count, and a torus's shape (empty for the other kinds)."""
    if not positional:
        raise UsageError(f"topology {spec!r} needs a rank count (e.g. {kind}:8 or --ranks 8)")
    if kind != "torus":
        return _int(positional[0], "topology rank count"), []
    try:
        shape = [int(x) for x in positional[0].lower().split("x")]
    except ValueError:
        raise UsageError(f"malformed torus shape {positional[0]!r} (examples: 4x4, 4x4x4)") from None
    if len(shape) not in (2, 3) or min(shape) < 1:
        raise UsageError(f"torus shape {positional[0]!r} must be 2D or 3D (4x4, 4x4x4)")
    return int(np.prod(shape)), shape


def _check_options(kind: str, opts: dict[str, str]) -> None:
    unknown = set(opts) - {"leaf", "oversub", "gpus", "tor", "uplink"}
    if unknown:
        raise UsageError(f"unknown topology option {sorted(unknown)[0]!r} (valid: leaf, "
                         f"oversub, uplink for fat-tree; gpus, tor, oversub for dual-plane)")
    if "uplink" in opts and kind != "fat-tree":
        raise UsageError(f"topology option 'uplink' is for fat-tree, not {kind}")


@dataclass(frozen=True, slots=True)
class _Build:
    """What a kind's builder needs: the spec's options, the link classes, a torus's shape."""

    opts: dict[str, str]
    inter: LinkClass
    intra: LinkClass
    shape: list[int]


def _build_ring(topo: Topology, b: _Build) -> None:
    p = topo.ranks
    for r in range(p):
        if p > 1:
            topo.add_pair(r, (r + 1) % p, b.inter, "net")
    topo.dims = [("Ring", p)]


def _build_fully_connected(topo: Topology, b: _Build) -> None:
    if topo.ranks > 1:
        topo.add_link(0, 1, b.inter, "net")   # the rest on first use
    topo.dims = [("FullyConnected", topo.ranks)]


def _build_switch(topo: Topology, b: _Build) -> None:
    p = topo.ranks
    for r in range(p):
        topo.add_pair(r, p, b.inter, "net")
    topo.dims = [("Switch", p)]


def _build_fat_tree(topo: Topology, b: _Build) -> None:
    p, opts, inter = topo.ranks, b.opts, b.inter
    leaf = _int(opts.get("leaf", "16"), "leaf")
    oversub = float(opts.get("oversub", "1"))
    if oversub <= 0:
        raise UsageError(f"oversub must be > 0, got {oversub}")
    nleaf = math.ceil(p / leaf)
    spine = p + nleaf
    # uplinks of a rank link's bandwidth each, or of the given rate (bytes/s)
    per_link = _rate_bytes(opts["uplink"]) * inter.beta if "uplink" in opts else 1.0
    topo.params.update(leaf=leaf, oversub=oversub, spine=spine)
    for r in range(p):
        topo.add_pair(r, p + r // leaf, inter, "net")
    for i in range(nleaf):
        members = min(leaf, p - i * leaf)
        topo.add_pair(p + i, spine, inter, "uplink", scale=members / oversub * per_link)
    topo.dims = [("Switch", p)] if nleaf == 1 else [("Switch", min(leaf, p)), ("Switch", nleaf)]


def _build_hypercube(topo: Topology, b: _Build) -> None:
    p = topo.ranks
    if p & (p - 1):
        raise UsageError(f"hypercube needs a power-of-two rank count, got {p}")
    for r in range(p):
        bit = 1
        while bit < p:
            topo.add_link(r, r ^ bit, b.inter, "net")
            bit <<= 1
    topo.dims = [("Ring", 2)] * int(math.log2(p)) if p > 1 else [("Ring", 1)]


def _build_torus(topo: Topology, b: _Build) -> None:
    shape = b.shape
    topo.dims = [("Ring", n) for n in shape]
    coords = np.array(np.unravel_index(np.arange(topo.ranks), shape))
    for d, n in enumerate(shape):
        if n == 1:
            continue
        nxt = coords.copy()
        nxt[d] = (nxt[d] + 1) % n
        for r, q in enumerate(np.ravel_multi_index(tuple(nxt), shape).tolist()):
            topo.add_pair(r, q, b.inter, "net")


def _build_dual_plane(topo: Topology, b: _Build) -> None:
    p, opts, inter = topo.ranks, b.opts, b.inter
    g = _int(opts.get("gpus", "8"), "gpus")
    tor = _int(opts.get("tor", "16"), "tor")
    oversub = float(opts.get("oversub", "1"))
    hosts = math.ceil(p / g)
    ntor = math.ceil(hosts / tor)
    host_base = p
    tor_base = host_base + hosts
    spine_base = tor_base + 2 * ntor
    topo.params.update(gpus=g, tor=tor, oversub=oversub, host_base=host_base,
                       tor_base=tor_base, spine_base=spine_base, tors_per_plane=ntor)
    for r in range(p):
        topo.add_pair(r, host_base + r // g, b.intra, "intra")
        for plane in (0, 1):
            topo.add_pair(r, tor_base + plane * ntor + (r // g) // tor, inter, "inter")
    if ntor > 1:
        for plane in (0, 1):
            for t in range(ntor):
                ranks_here = min(tor * g, p - t * tor * g)
                topo.add_pair(tor_base + plane * ntor + t, spine_base + plane, inter,
                              "uplink", scale=ranks_here / oversub)
    topo.dims = [("Switch", min(g, p))]
    if hosts > 1:
        topo.dims.append(("Switch", hosts))


_BUILDERS = {"ring": _build_ring, "fully-connected": _build_fully_connected,
             "switch": _build_switch, "fat-tree": _build_fat_tree, "hypercube": _build_hypercube,
             "torus": _build_torus, "dual-plane": _build_dual_plane}
_ROUTES = {"ring": Topology._ring_route, "fully-connected": Topology._fully_connected_route,
           "switch": Topology._switch_route, "fat-tree": Topology._fat_tree_route,
           "hypercube": Topology._hypercube_route, "torus": Topology._torus_route,
           "dual-plane": Topology._dual_plane_route}


def build_topology(spec: str, ranks: int | None, inter: LinkClass,
                   intra: LinkClass | None = None) -> Topology:
    """A topology from its spec; `inter` for network links, `intra` for in-host links."""
    kind, positional, opts = parse_topology(spec, ranks)
    p, shape = _rank_count(kind, positional, spec)
    if ranks is not None and ranks != p:
        raise UsageError(f"--ranks {ranks} does not match topology {spec!r} ({p} ranks)")
    _check_options(kind, opts)
    topo = Topology(kind, p, spec)
    topo._inter = inter
    _BUILDERS[kind](topo, _Build(opts, inter, intra or inter, shape))
    topo.num_nodes = max(p, 1 + max((max(k) for k in topo.link_ids), default=p - 1))
    return topo
