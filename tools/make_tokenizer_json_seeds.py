#!/usr/bin/env python3
"""Seeds for fuzz_hf_tokenizer_json (fuzz/seeds/hf_tokenizer_json/): small tokenizer.json documents of our
own in the layouts served models bring (Hugging Face tokenizers' serialization), each using different
normalizers, pre-tokenizers, post-processors and decoders, with synthetic vocabularies. Standard library only.

    python3 tools/make_tokenizer_json_seeds.py
"""
import json
import pathlib

OUT = pathlib.Path(__file__).resolve().parent.parent / "fuzz" / "seeds" / "hf_tokenizer_json"


def gpt2_byte_chars() -> list[str]:
    """GPT-2's bytes_to_unicode alphabet in byte order."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    table = dict(zip(bs, cs))
    return [chr(table[b]) for b in range(256)]


def byte_level() -> dict:
    vocab = {c: i for i, c in enumerate(gpt2_byte_chars())}
    merges = [("Ġ", "t"), ("h", "e"), ("Ġt", "he"), ("i", "n"), ("Ġ", "in"), ("1", "2")]
    for a, b in merges:
        vocab.setdefault(a + b, len(vocab))
    n = len(vocab)
    split = ("(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\\r\\n]*"
             "|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+")
    return {
        "version": "1.0",
        "added_tokens": [
            {"id": n, "content": "<|begin|>", "special": True, "normalized": False, "lstrip": False,
             "rstrip": False, "single_word": False},
            {"id": n + 1, "content": "<|end|>", "special": True, "normalized": False},
            {"id": n + 2, "content": "    ", "special": False, "normalized": True},
        ],
        "normalizer": {"type": "NFC"},
        "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
            {"type": "Split", "pattern": {"Regex": split}, "behavior": "Isolated", "invert": False},
            {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}]},
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<|begin|>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}}, {"Sequence": {"id": "B", "type_id": 1}}],
                           "special_tokens": {"<|begin|>": {"id": "<|begin|>", "ids": [n], "tokens": ["<|begin|>"]}}},
        "decoder": {"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True},
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False,
                  "ignore_merges": True, "vocab": vocab, "merges": [f"{a} {b}" for a, b in merges]},
    }


def sentencepiece_like() -> dict:
    """Llama 2 style: byte fallback, the space as U+2581 by normalizer, a Replace/ByteFallback/Fuse/Strip
    decoder, BOS by the post-processor."""
    pieces = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)] + ["▁"]
    pieces += [chr(c) for c in range(ord("a"), ord("z") + 1)] + ["▁t", "he", "▁the", "▁a", "in", "▁in"]
    vocab = {p: i for i, p in enumerate(pieces)}
    merges = [["▁", "t"], ["h", "e"], ["▁t", "he"], ["▁", "a"], ["i", "n"], ["▁", "in"]]
    return {
        "version": "1.0",
        "added_tokens": [{"id": i, "content": t, "special": True, "normalized": False}
                         for i, t in enumerate(["<unk>", "<s>", "</s>"])],
        "normalizer": {"type": "Sequence", "normalizers": [
            {"type": "Prepend", "prepend": "▁"}, {"type": "Replace", "pattern": {"String": " "}, "content": "▁"}]},
        "pre_tokenizer": None,
        "post_processor": {"type": "TemplateProcessing",
                           "single": [{"SpecialToken": {"id": "<s>", "type_id": 0}},
                                      {"Sequence": {"id": "A", "type_id": 0}}],
                           "pair": [{"Sequence": {"id": "A", "type_id": 0}}],
                           "special_tokens": {"<s>": {"id": "<s>", "ids": [1], "tokens": ["<s>"]}}},
        "decoder": {"type": "Sequence", "decoders": [
            {"type": "Replace", "pattern": {"String": "▁"}, "content": " "}, {"type": "ByteFallback"},
            {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]},
        "model": {"type": "BPE", "unk_token": "<unk>", "fuse_unk": True, "byte_fallback": True,
                  "vocab": vocab, "merges": merges},
    }


def metaspace() -> dict:
    """Metaspace pre-tokenizer and decoder, digits split, lowercase and NFKC normalizers."""
    d = sentencepiece_like()
    d["normalizer"] = {"type": "Sequence", "normalizers": [{"type": "NFKC"}, {"type": "Lowercase"}]}
    d["pre_tokenizer"] = {"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True},
        {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": True}]}
    d["decoder"] = {"type": "Metaspace", "replacement": "▁", "prepend_scheme": "first", "split": True}
    return d


def main() -> None:
    OUT.mkdir(parents=True, exist_ok=True)
    for name, doc in (("byte_level", byte_level()), ("sentencepiece_like", sentencepiece_like()),
                      ("metaspace", metaspace())):
        path = OUT / f"{name}.json"
        path.write_text(json.dumps(doc, ensure_ascii=False, separators=(",", ":")) + "\n")
        print(f"{path.name}: {path.stat().st_size} bytes")


if __name__ == "__main__":
    main()
