#!/usr/bin/env python3
"""Vocabulary-only GGUF seeds for fuzz_gguf (fuzz/seeds/gguf/): the metadata of our own golden fixtures
(tests/golden/fixtures/*.gguf, written by tools/reference/gguf_export.py with synthetic vocabularies) with
no tensors, so that libFuzzer's mutations land in the tokenizer.ggml.* arrays that load_gguf_tokenizer
reads instead of in weight bytes. Standard library only; GGUF v3 layout (ggml docs/gguf.md): magic,
version u32, tensor count u64, metadata count u64, then the key/value pairs.

    python3 tools/make_gguf_vocab_seeds.py   # rewrites fuzz/seeds/gguf/vocab_*.gguf
"""
import pathlib
import struct

ROOT = pathlib.Path(__file__).resolve().parent.parent
# GGUF value types: fixed sizes of the scalar ones; 8 = string, 9 = array.
SCALAR = {0: 1, 1: 1, 2: 2, 3: 2, 4: 4, 5: 4, 6: 4, 7: 1, 10: 8, 11: 8, 12: 8}


def skip_value(buf: bytes, at: int, vtype: int) -> int:
    if vtype in SCALAR:
        return at + SCALAR[vtype]
    if vtype == 8:
        (n,) = struct.unpack_from("<Q", buf, at)
        return at + 8 + n
    if vtype == 9:
        etype, count = struct.unpack_from("<IQ", buf, at)
        at += 12
        for _ in range(count):
            at = skip_value(buf, at, etype)
        return at
    raise ValueError(f"unknown GGUF value type {vtype}")


def metadata_only(src: pathlib.Path) -> bytes:
    buf = src.read_bytes()
    magic, version, _tensors, kvs = struct.unpack_from("<4sIQQ", buf, 0)
    assert magic == b"GGUF" and version == 3, src
    at = 24
    for _ in range(kvs):
        (klen,) = struct.unpack_from("<Q", buf, at)
        at += 8 + klen
        (vtype,) = struct.unpack_from("<I", buf, at)
        at = skip_value(buf, at + 4, vtype)
    return struct.pack("<4sIQQ", magic, version, 0, kvs) + buf[24:at]


def main() -> None:
    out = ROOT / "fuzz" / "seeds" / "gguf"
    for name in ("llama-tiny", "qwen2-tiny"):  # SentencePiece ("llama") and byte-level BPE ("gpt2")
        data = metadata_only(ROOT / "tests" / "golden" / "fixtures" / f"{name}.gguf")
        (out / f"vocab_{name}.gguf").write_bytes(data)
        print(f"vocab_{name}.gguf: {len(data)} bytes")


if __name__ == "__main__":
    main()
