"""Layer 1: canonical JSON, digests, HMAC, zstd and content-defined chunking. Imports nothing above."""

from overnight.codec.canonical import decode, dumps, dumps_sorted, encode, from_tree, loads, to_tree
from overnight.codec.digest import sha256
from overnight.codec.registry import register_codec, register_type

__all__ = [
    "decode",
    "dumps",
    "dumps_sorted",
    "encode",
    "from_tree",
    "loads",
    "register_codec",
    "register_type",
    "sha256",
    "to_tree",
]
