"""Per-rank keys agreed through an unauthenticated store (torchrun's, across hosts, where no
secret was given): finite-field Diffie-Hellman (RFC 3526's 2048-bit group 14).

Each rank publishes g^x (x: 256 random bits, never sent), rank 0 publishes g^x0, and rank r's
key is a hash of g^(x0 x) and both public values, which rank 0 derives for each rank it admits
to its control store (ccbench.run.control: a rank proves its own key, so it can speak only as
itself). Whoever only reads torchrun's store learns no key. Whoever can write to it while the
ranks start can put its own values in the place of theirs and stand between a rank and rank 0:
no exchange without a shared secret can prevent that, which is why rank 0 says so in one line
and CCBENCH_CONTROL_SECRET (or CCBENCH_CONTROL_SECRET_FILE) closes it (docs/security.md).
"""

from __future__ import annotations

import hashlib
import secrets
import sys
from typing import Any

from ccbench.errors import RunFailure

__all__ = ["ACROSS_HOSTS_NOTE", "rank0_keys", "rank_key"]

_P = int(
    "FFFFFFFFFFFFFFFFC90FDAA22168C234C4C6628B80DC1CD129024E088A67CC74020BBEA63B139B22514A0879"
    "8E3404DDEF9519B3CD3A431B302B0A6DF25F14374FE1356D6D51C245E485B576625E7EC6F44C42E9A637ED6B"
    "0BFF5CB6F406B7EDEE386BFB5A899FA5AE9F24117C4B1FE649286651ECE45B3DC2007CB8A163BF0598DA4836"
    "1C55D39A69163FA8FD24CF5F83655D23DCA3AD961C62F356208552BB9ED529077096966D670C354E4ABC9804"
    "F1746C08CA18217C32905E462E36CE3BE39E772C180E86039B2783A2EC07A28FB5C55DF06F4C52C9DE2BCBF6"
    "955817183995497CEA956AE515D2261898FA051015728E5A8AACAA68FFFFFFFFFFFFFFFF", 16)
_G = 2

ACROSS_HOSTS_NOTE = (
    "ccbench: warning: torchrun across hosts without CCBENCH_CONTROL_SECRET: each rank agreed "
    "its key with rank 0 through torchrun's store, which has no authentication, so someone who "
    "can write to that store while the ranks start could stand between a rank and rank 0; set "
    "CCBENCH_CONTROL_SECRET (the same on every host) or CCBENCH_CONTROL_SECRET_FILE to close "
    "that (docs/security.md)")


def _pair() -> tuple[int, int]:
    private = secrets.randbits(256) | 1 << 255
    return private, pow(_G, private, _P)


def _public(text: bytes, rank: int) -> int:
    try:
        value = int(text.decode(), 16)
    except (UnicodeDecodeError, ValueError):
        value = 0
    if not 1 < value < _P - 1:
        raise RunFailure(f"start-up: rank {rank}'s public key in torchrun's store is not one "
                         f"(someone else wrote to torchrun's store?)")
    return value


def _key(shared: int, rank0: int, rank: int) -> str:
    return hashlib.sha256(f"ccbench-control-key/{shared:x}/{rank0:x}/{rank:x}".encode()
                          ).hexdigest()


def rank_key(store: Any, key: str, rank: int, timeout: float) -> str:
    """This rank's key with rank 0 (rank > 0)."""
    private, public = _pair()
    store.set(f"{key}/pub/{rank}", f"{public:x}")
    rank0 = _public(store.get(f"{key}/pub/0"), 0)
    return _key(pow(rank0, private, _P), rank0, public)


def rank0_keys(store: Any, key: str, world_size: int, timeout: float) -> dict[int, str]:
    """Every rank's key, as rank 0 derives them (its own: a fresh secret)."""
    private, public = _pair()
    store.set(f"{key}/pub/0", f"{public:x}")
    keys = {0: secrets.token_hex(32)}
    for rank in range(1, world_size):
        theirs = _public(store.get(f"{key}/pub/{rank}"), rank)
        keys[rank] = _key(pow(theirs, private, _P), public, theirs)
    print(ACROSS_HOSTS_NOTE, file=sys.stderr, flush=True)
    return keys
