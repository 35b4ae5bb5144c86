"""Decompresses a shipped checkpoint for the Python tools: models/target and models/drafter are
kept in git as `model.safetensors.compressed` (crates/engine/src/compressed.rs owns the format:
the safetensors header as is, the data's high bytes zstd-compressed, its low bytes raw), and the
Rust engine writes `model.safetensors` beside it the first time it loads one. Tools that hand the
directory to transformers or llama.cpp's converter call `ensure_decompressed` first, so they work
before any Rust command has run. Needs `zstandard` (tools/fixtures/requirements.txt).
"""
import hashlib
import os
import pathlib
import struct

MAGIC = b"SFZPLN01"
FIXED = 8 + 3 * 8 + 32


def ensure_decompressed(directory: pathlib.Path) -> None:
    """Writes DIR/model.safetensors from DIR/model.safetensors.compressed when only the latter exists."""
    plain = directory / "model.safetensors"
    packed = directory / "model.safetensors.compressed"
    if plain.exists() or not packed.is_file():
        return
    import zstandard

    raw = packed.read_bytes()
    if raw[:8] != MAGIC or len(raw) < FIXED:
        raise SystemExit(f"{packed}: not a compressed checkpoint")
    file_len, prefix, frame_len = struct.unpack_from("<QQQ", raw, 8)
    digest = raw[32:FIXED]
    data = file_len - prefix
    low_len = data - data // 2
    if FIXED + prefix + frame_len + low_len != len(raw):
        raise SystemExit(f"{packed}: its lengths do not add up (truncated?)")
    head = raw[FIXED:FIXED + prefix]
    frame = raw[FIXED + prefix:FIXED + prefix + frame_len]
    low = raw[FIXED + prefix + frame_len:]
    high = zstandard.ZstdDecompressor().decompress(frame, max_output_size=data // 2)
    body = bytearray(data)
    body[0::2] = low
    body[1::2] = high
    out = head + bytes(body)
    if hashlib.sha256(out).digest() != digest:
        raise SystemExit(f"{packed}: the decompressed bytes do not have the recorded SHA-256")
    tmp = plain.with_name(f"model.safetensors.tmp-{os.getpid()}")
    tmp.write_bytes(out)
    tmp.replace(plain)
