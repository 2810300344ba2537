"""Which of this host's addresses to publish to ranks on other hosts (control store, gloo)."""

from __future__ import annotations

import fcntl
import ipaddress
import os
import socket
import struct

__all__ = ["free_port", "interface_of", "listen_address", "loopback_interface",
           "published_address"]


def free_port(host: str = "") -> int:
    """A TCP port free on `host` now ("" all interfaces, "127.0.0.1" loopback only); the
    caller binds it soon after, and a race with another process is reported by that bind."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _is_loopback(address: str) -> bool:
    return ipaddress.ip_address(address).is_loopback


def _interfaces() -> list[tuple[str, str]]:
    """(name, IPv4 address) of this network namespace's interfaces (SIOCGIFADDR)."""
    found = []
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for _, name in socket.if_nameindex():
            try:
                packed = fcntl.ioctl(sock.fileno(), 0x8915,   # SIOCGIFADDR
                                     struct.pack("256s", name.encode()[:15]))
            except OSError:                                   # no IPv4 address
                continue
            found.append((name, socket.inet_ntoa(packed[20:24])))
    return found


def _interface_addresses() -> list[str]:
    """IPv4 addresses of this network namespace's interfaces, loopback last."""
    return sorted((address for _, address in _interfaces()), key=_is_loopback)


def loopback_interface() -> str | None:
    """The name of the interface that carries 127.0.0.1 ('lo' on Linux), if any."""
    return interface_of("127.0.0.1")


def interface_of(address: str) -> str | None:
    """The interface whose (primary IPv4) address is `address`, if any."""
    return next((name for name, mine in _interfaces() if mine == address), None)


def published_address(peer: str | None = None) -> str:
    """The address rank 0 publishes for its control store: one the other hosts can reach.

    Not the hostname (it may resolve only here, e.g. to 127.0.1.1) and not 127.0.0.1: the
    address of the interface that routes to `peer` (torchrun's MASTER_ADDR), else the hostname's
    address if it is not loopback, else the first non-loopback interface address.
    CCBENCH_CONTROL_ADDR overrides the choice.
    """
    explicit = os.environ.get("CCBENCH_CONTROL_ADDR")
    if explicit:
        return explicit
    candidates = []
    if peer:
        try:
            with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
                sock.connect((peer, 9))           # UDP: picks the route, sends nothing
                candidates.append(sock.getsockname()[0])
        except OSError:
            pass
        if candidates and _is_loopback(candidates[0]):
            return candidates[0]                  # the rendezvous is on this host: so are all
    try:
        candidates.append(socket.gethostbyname(socket.gethostname()))
    except OSError:
        pass
    candidates += _interface_addresses()
    return next((a for a in candidates if not _is_loopback(a)), "127.0.0.1")


def listen_address(host: str, all_local: bool = False) -> str:
    """Where a server for peers that reach it at `host` binds: loopback when every peer runs on
    this host (`all_local`) or `host` is loopback, else the address `host` names (the interface
    the peers come in on), never every interface. A name that resolves to loopback here only
    (a Debian 127.0.1.1 hostname) in a run across hosts: the published address."""
    if all_local:
        return "127.0.0.1"
    try:
        address = socket.gethostbyname(host)
    except OSError:
        return published_address()
    if not _is_loopback(address):
        return address
    # loopback asked for by address or by name: the peers are here; a host name that
    # resolves to loopback only here: the peers come in on the published address
    return address if _is_ip(host) or host == "localhost" else published_address()


def _is_ip(text: str) -> bool:
    try:
        ipaddress.ip_address(text)
    except ValueError:
        return False
    return True
