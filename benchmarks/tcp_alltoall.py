"""A direct all-to-all in plain TCP sockets, no collective library: how close to the link
p-1 concurrent transfers per port finish on the testbed.

    python benchmarks/tcp_alltoall.py --hosts 3,4,6,8 --link 100M --size 8M

For each host count: `ccbench testbed up` (one switch), one process per emulated host; each
opens one TCP connection to every other host, then, at a start time every process waits for
(the hosts share one kernel, so one clock), sends SIZE/p bytes to every peer at once (a thread
per peer) while receiving as much from each. The time of a repetition is the last receive's
end minus the start; printed: the median of 5 repetitions as a fraction of the link's payload
rate for the (p-1)/p SIZE bytes a port carries, and the spread of the per-flow end times.
MPI's and gloo's direct all-to-alls reached 0.76-0.81 (MPI) of the link at 3-8 hosts out of
place, where every port carries 0.93-0.96 in steady state (iperf3, every pair at once):
this shows whether plain TCP flows finishing at different times explain the gap.
Needs root; takes down what it brings up.
"""

from __future__ import annotations

import argparse
import json
import socket
import statistics
import subprocess
import sys
import threading
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PAYLOAD_SHARE = 1448 / 1514      # TCP/IP over Ethernet, MTU 1500, TCP timestamps
PORT = 29850
REPS = 5


def _recv_exact(conn: socket.socket, nbytes: int, buf: bytearray) -> None:
    view, got = memoryview(buf), 0
    while got < nbytes:
        n = conn.recv_into(view[: min(len(buf), nbytes - got)])
        if n == 0:
            raise ConnectionError("peer closed")
        got += n


def _receive(conn: socket.socket, nbytes: int, begin: float, ends: dict[str, float],
             peer: str) -> None:
    _recv_exact(conn, nbytes, bytearray(1 << 20))
    ends[peer] = time.time() - begin


def peer_main(rank: int, addresses: list[str], per_peer: int, start: float) -> None:
    """One emulated host: connect to everyone, then REPS all-to-alls at start + 2 s each."""
    p = len(addresses)
    listener = socket.create_server(("0.0.0.0", PORT), backlog=p)
    conns: dict[int, socket.socket] = {}
    for _ in range(rank):                    # accept from lower ranks, connect to higher ones
        conn, _ = listener.accept()
        conns[int.from_bytes(conn.recv(1), "big")] = conn
    for peer in range(rank + 1, p):
        while True:
            try:
                conn = socket.create_connection((addresses[peer], PORT), timeout=30)
                break
            except OSError:
                time.sleep(0.05)
        conn.sendall(rank.to_bytes(1, "big"))
        conns[peer] = conn
    for conn in conns.values():
        conn.settimeout(None)
    payload = b"\1" * per_peer
    results = []
    for rep in range(REPS):
        begin = start + 3.0 * rep
        ends: dict[str, float] = {}
        threads = [thread for q, conn in conns.items() for thread in (
            threading.Thread(target=conn.sendall, args=(payload,)),
            threading.Thread(target=_receive, args=(conn, per_peer, begin, ends, str(q))))]
        time.sleep(max(0.0, begin - time.time()))
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        results.append(ends)
    print(json.dumps({"rank": rank, "ends": results}), flush=True)


def drive(hosts: list[int], link: str, size: int) -> None:
    from ccbench import testbed
    from ccbench.testbed.net import host_command
    from ccbench.units import parse_rate

    payload = parse_rate(link) / 8 * PAYLOAD_SHARE
    for n in hosts:
        subprocess.run([sys.executable, "-m", "ccbench", "testbed", "up", "--hosts", str(n),
                        "--link", link], check=True, capture_output=True, cwd=ROOT)
        try:
            plan = testbed.load_plan()
            assert plan is not None
            addresses = [h.addresses["eth0"].split("/")[0] for h in plan.hosts]
            per_peer = size // n
            start = time.time() + 3.0 + 0.3 * n
            procs = [subprocess.Popen(host_command(h.netns, h.name, [
                sys.executable, __file__, "--peer", str(rank), "--addresses", ",".join(addresses),
                "--per-peer", str(per_peer), "--start", repr(start)]),
                stdout=subprocess.PIPE, text=True, cwd=ROOT) for rank, h in enumerate(plan.hosts)]
            outs = [json.loads(proc.communicate(timeout=300)[0].strip().splitlines()[-1])
                    for proc in procs]
            makespans, spreads = [], []
            for rep in range(REPS):
                ends = [e for out in outs for e in out["ends"][rep].values()]
                makespans.append(max(ends))
                spreads.append(min(ends) / max(ends))
            reached = (n - 1) * per_peer / statistics.median(makespans) / payload
            print(f"{n} hosts, {n - 1} flows per port, {per_peer} B each: median "
                  f"{statistics.median(makespans) * 1e3:.1f} ms = {reached:.3f} of the link "
                  f"(repetitions {', '.join(f'{(n - 1) * per_peer / m / payload:.2f}' for m in makespans)}); "
                  f"first flow ends at {statistics.median(spreads):.2f} of the last", flush=True)
        finally:
            subprocess.run([sys.executable, "-m", "ccbench", "testbed", "down"],
                           capture_output=True, cwd=ROOT)


def main() -> int:
    from ccbench.units import parse_size

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--hosts", default="3,4,6,8")
    ap.add_argument("--link", default="100M")
    ap.add_argument("--size", default="8M")
    ap.add_argument("--peer", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--addresses", help=argparse.SUPPRESS)
    ap.add_argument("--per-peer", type=int, help=argparse.SUPPRESS)
    ap.add_argument("--start", type=float, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.peer is not None:
        peer_main(args.peer, args.addresses.split(","), args.per_peer, args.start)
    else:
        drive([int(x) for x in args.hosts.split(",")], args.link, parse_size(args.size))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
