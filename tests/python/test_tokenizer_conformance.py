"""Token ids of `inferx tokenize` against Hugging Face `tokenizers` (pinned in tests/requirements.txt).

Every tokenizer in ../shared/testdata is run through both on the same corpus (tokenizer_corpus.jsonl:
ASCII, whitespace runs, tabs/newlines, digits, punctuation, emoji, CJK, Arabic, combining marks, code,
special tokens inside text), with and without special tokens, and decoded back. The reference is the
`tokenizers` package itself; nothing here is an expected id written by hand.

Tokenizers under test:
- gpt-neox-20b/20B_tokenizer.json as it is; ollama-mini-llama/mini_llama.json with the added-token
  fields that tokenizers requires and the synthetic file leaves out filled in with their defaults;
- tinyllama-1.1b-chat-v1.0/tokenizer.json: `tokenizers` 0.23 refuses its three "a b" merges whose tokens
  hold a space (see SOURCES.md, "Quirk"); both sides read a copy with those merges written as pairs.
  InferX on the original file gives the same refusal (a clear error), checked below;
- gpt2/vocab.json + merges.txt and llama3.2/encoder.json + vocab.bpe, made into tokenizers by
  `tokenizers` (BPE.from_file) with the pre-tokenizers of GPT-2 and Llama 3 (+ special tokens and the BOS
  template) and saved as tokenizer.json; InferX also reads the gpt2 folder directly;
- the pre-tokenizer/normalizer pipelines of other families (Qwen2, Falcon, StarCoder, DeepSeek Coder, and
  Metaspace of newer Llama-2/Mistral files) over those vocabularies, serialized by `tokenizers`.

Invalid UTF-8 (documented behaviour): InferX replaces each ill-formed subsequence with U+FFFD (maximal
subparts, as Python's bytes.decode("utf-8", "replace")) and then tokenizes; the ids must equal Hugging
Face's ids for the replaced string (its Python API only accepts str).
"""
import copy
import json
import os
import subprocess
from pathlib import Path

import pytest
from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, processors

ROOT = Path(__file__).resolve().parents[2]
TESTDATA = Path(os.environ.get("INFERX_TESTDATA_DIR", "/work/shared/testdata"))
HF = TESTDATA / "hf-tokenizers"
INFERX = Path(os.environ.get("INFERX_BIN", ROOT / "build/cpu/src/cli/inferx"))
CORPUS = [json.loads(l) for l in (Path(__file__).parent / "tokenizer_corpus.jsonl").read_text().splitlines() if l]

LLAMA3_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
                r"\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_REGEX = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|"
               r"\s*[\r\n]+|\s+(?!\S)|\s+")


def split(regex, behavior="Isolated"):
    return {"type": "Split", "pattern": {"Regex": regex}, "behavior": behavior, "invert": False}


BYTE_LEVEL_NO_REGEX = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": False}
BYTE_LEVEL = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": True, "use_regex": True}
# Pre-tokenizers (and normalizers) as the tokenizer.json files of these families declare them.
PIPELINES = {
    "qwen2": ({"type": "Sequence", "pretokenizers": [split(QWEN2_REGEX), BYTE_LEVEL_NO_REGEX]}, {"type": "NFC"}),
    "falcon": ({"type": "Sequence", "pretokenizers": [
        {"type": "Punctuation", "behavior": "Contiguous"}, BYTE_LEVEL,
        {"type": "Digits", "individual_digits": False}, split("[0-9][0-9][0-9]")]}, None),
    "starcoder": ({"type": "Sequence", "pretokenizers": [
        {"type": "Digits", "individual_digits": True}, BYTE_LEVEL]}, None),
    "deepseek-coder": ({"type": "Sequence", "pretokenizers": [
        split("[\r\n]"), split(r"\s?\p{L}+"), split(r"\s?\p{P}+"), split("[\u4e00-\u9fa5\u0800-\u4e00\uac00-\ud7ff]+"),
        {"type": "Digits", "individual_digits": True}, BYTE_LEVEL_NO_REGEX]}, {"type": "Sequence", "normalizers": []}),
    "prefix-space": ({"type": "ByteLevel", "add_prefix_space": True, "trim_offsets": True, "use_regex": True}, None),
}


def run(args, **kw):
    if not INFERX.exists():
        pytest.skip(f"{INFERX} is not built (set INFERX_BIN)")
    return subprocess.run([str(INFERX), *args], capture_output=True, **kw)


def fix_tinyllama(doc):
    """Writes merges as [a, b] pairs, splitting ambiguous "a b" strings where both halves are tokens."""
    vocab = doc["model"]["vocab"]
    merges = []
    for m in doc["model"]["merges"]:
        if isinstance(m, list):
            merges.append(m)
            continue
        cands = [(m[:i], m[i + 1:]) for i, c in enumerate(m) if c == " "]
        cands = [(a, b) for a, b in cands if a in vocab and b in vocab and a + b in vocab]
        assert cands, m
        merges.append(list(cands[0]))
    doc["model"]["merges"] = merges
    return doc


def with_special(tok, names, template_bos=None):
    tok.add_special_tokens([AddedToken(n, special=True, normalized=False) for n in names])
    if template_bos:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{template_bos} $A", special_tokens=[(template_bos, tok.token_to_id(template_bos))])
    return tok


@pytest.fixture(scope="session")
def tokenizers_under_test(tmp_path_factory):
    """name -> (path InferX loads, Hugging Face Tokenizer)."""
    tmp = tmp_path_factory.mktemp("tok")
    out = {}

    def save(name, tok_or_doc):
        path = tmp / f"{name}.json"
        text = tok_or_doc.to_str() if isinstance(tok_or_doc, Tokenizer) else json.dumps(tok_or_doc)
        path.write_text(text)
        out[name] = (path, Tokenizer.from_file(str(path)))

    path = HF / "gpt-neox-20b/20B_tokenizer.json"
    out["gpt-neox-20b"] = (path, Tokenizer.from_file(str(path)))
    # mini_llama.json leaves out fields tokenizers requires (single_word, ...): both read it completed.
    mini = json.loads((HF / "ollama-mini-llama/mini_llama.json").read_text())
    for t in mini.get("added_tokens", []):
        for key in ("single_word", "lstrip", "rstrip"):
            t.setdefault(key, False)
        t.setdefault("normalized", not t.get("special", False))
    save("mini-llama", mini)

    tiny = fix_tinyllama(json.loads((HF / "tinyllama-1.1b-chat-v1.0/tokenizer.json").read_text()))
    save("tinyllama", tiny)
    meta = copy.deepcopy(tiny)  # the newer Llama-2/Mistral layout: Metaspace instead of Prepend + Replace
    meta["normalizer"] = None
    meta["pre_tokenizer"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
    meta["decoder"] = {"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": False}
    save("tinyllama-metaspace", meta)

    gpt2 = Tokenizer(models.BPE.from_file(str(HF / "gpt2/vocab.json"), str(HF / "gpt2/merges.txt")))
    gpt2.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    gpt2.decoder = decoders.ByteLevel()
    with_special(gpt2, ["<|endoftext|>"])
    save("gpt2", gpt2)
    out["gpt2-folder"] = (HF / "gpt2", out["gpt2"][1])

    llama3 = Tokenizer(models.BPE.from_file(str(HF / "llama3.2/encoder.json"), str(HF / "llama3.2/vocab.bpe"),
                                            ignore_merges=True))
    llama3.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(LLAMA3_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    llama3.decoder = decoders.ByteLevel()
    with_special(llama3, ["<|begin_of_text|>", "<|end_of_text|>", "<|eot_id|>"], template_bos="<|begin_of_text|>")
    save("llama3.2", llama3)

    base = json.loads(out["llama3.2"][0].read_text())
    for family, (pre, norm) in PIPELINES.items():
        doc = copy.deepcopy(base if family in ("qwen2", "deepseek-coder") else json.loads(out["gpt2"][0].read_text()))
        doc["pre_tokenizer"], doc["normalizer"] = pre, norm
        doc["model"]["ignore_merges"] = False
        doc["post_processor"] = None
        save(f"{family}-style", doc)
    return out


def corpus_for(tok):
    """The corpus with {S0}, {S1} replaced by this tokenizer's added tokens."""
    added = [t.content for t in tok.get_added_tokens_decoder().values()] or ["<s>", "</s>"]
    added = (added * 2)[:2]
    return [c.replace("{S0}", added[0]).replace("{S1}", added[-1]) for c in CORPUS]


NAMES = ["gpt-neox-20b", "mini-llama", "tinyllama", "tinyllama-metaspace", "gpt2", "gpt2-folder", "llama3.2",
         "qwen2-style", "falcon-style", "starcoder-style", "deepseek-coder-style", "prefix-space-style"]


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("special", [True, False], ids=["special", "plain"])
def test_ids_equal_hugging_face(tokenizers_under_test, tmp_path, name, special):
    path, hf = tokenizers_under_test[name]
    corpus = corpus_for(hf)
    inp = tmp_path / "corpus.jsonl"
    inp.write_text("".join(json.dumps(c) + "\n" for c in corpus))
    args = ["tokenize", "--model", str(path), "--jsonl", str(inp)] + ([] if special else ["--no-special"])
    res = run(args)
    assert res.returncode == 0, res.stderr.decode()
    ours = [[int(x) for x in l.split()] for l in res.stdout.decode().split("\n")[:len(corpus)]]
    want = [e.ids for e in hf.encode_batch(corpus, add_special_tokens=special)]
    bad = [(c, o, w) for c, o, w in zip(corpus, ours, want) if o != w]
    assert not bad, f"{len(bad)}/{len(corpus)} differ; first: {bad[0]!r}"
    assert len(ours) == len(corpus)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("skip", [True, False], ids=["skip_special", "keep_special"])
def test_decode_equals_hugging_face(tokenizers_under_test, tmp_path, name, skip):
    path, hf = tokenizers_under_test[name]
    corpus = corpus_for(hf)
    ids = [e.ids for e in hf.encode_batch(corpus)]
    # Plus sequences that cut multi-byte characters, which decode with U+FFFD.
    ids += [i[:k] for i in ids if len(i) > 2 for k in (1, len(i) // 2)]
    inp = tmp_path / "ids.jsonl"
    inp.write_text("".join(json.dumps(i) + "\n" for i in ids))
    res = run(["detokenize", "--model", str(path), "--jsonl", str(inp)] + ([] if skip else ["--keep-special"]))
    assert res.returncode == 0, res.stderr.decode()
    ours = [json.loads(l) for l in res.stdout.decode().splitlines()]
    want = hf.decode_batch(ids, skip_special_tokens=skip)
    bad = [(i, o, w) for i, o, w in zip(ids, ours, want) if o != w]
    assert not bad, f"{len(bad)}/{len(ids)} differ; first: {bad[0]!r}"
    assert len(ours) == len(ids)


INVALID_UTF8 = [b"abc\xffdef", b"\xe2\x82 half euro", b"\xf0\x9f\x98 cut emoji \xf0\x9f\x98\x80",
                b"\xc0\xaf overlong", b"\xed\xa0\x80 surrogate", b"lone \x80\x80 continuation", b"\xf4\x90\x80\x80 big"]


@pytest.mark.parametrize("name", ["gpt2", "llama3.2", "tinyllama", "gpt-neox-20b"])
def test_invalid_utf8_is_replaced_like_python(tokenizers_under_test, name):
    path, hf = tokenizers_under_test[name]
    for raw in INVALID_UTF8:
        res = run(["tokenize", "--model", str(path), "--ids", "--no-special", raw])
        assert res.returncode == 0, res.stderr.decode()
        ours = [int(x) for x in res.stdout.split()]
        assert ours == hf.encode(raw.decode("utf-8", "replace"), add_special_tokens=False).ids, raw


def test_tinyllama_original_file_is_refused_like_hugging_face():
    path = HF / "tinyllama-1.1b-chat-v1.0/tokenizer.json"
    with pytest.raises(Exception):
        Tokenizer.from_file(str(path))
    res = run(["tokenize", "--model", str(path), "hello"])
    assert res.returncode == 1
    assert b"merges[18917]" in res.stderr and b"tokenizer.json" in res.stderr


def test_hf_folder_uses_config_files():
    # TinyLlama's folder: tokenizer_config.json names <s>/</s>; the template adds BOS.
    res = run(["tokenize", "--model", str(HF / "tinyllama-1.1b-chat-v1.0"), "--ids", "hi"])
    # The folder's tokenizer.json has the merges tokenizers refuses, so the folder is refused too.
    assert res.returncode == 1 and b"merges[18917]" in res.stderr
