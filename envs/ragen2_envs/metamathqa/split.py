"""Deterministic train/test split by hashing a key: no state, same answer on every machine."""

from __future__ import annotations

import hashlib

SPLITS = ("train", "test")


def split_of(key: str, test_fraction: float) -> str:
    """``"test"`` for a ``test_fraction`` share of keys (by SHA-256), ``"train"`` for the rest."""
    digest = hashlib.sha256(key.encode("utf-8")).digest()
    # the first 8 bytes as a number in [0, 1): uniform over keys, unlike Python's salted hash()
    position = int.from_bytes(digest[:8], "big") / 2**64
    return "test" if position < test_fraction else "train"
