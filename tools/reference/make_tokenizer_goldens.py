"""Tokenizer goldens: a small Kimi-format tokenizer and the ids Python tiktoken gives for it.

    python make_tokenizer_goldens.py            # write into <repo>/tests/golden/tokenizer
    python make_tokenizer_goldens.py --check    # regenerate into a temp dir, compare byte for byte

What it writes (tests/golden/tokenizer/README.md describes each file):
  tiktoken/tiktoken.model         byte-level BPE ranks trained here on a multilingual sample, Kimi's format
                                  (`<base64 bytes> <rank>` per line), single-byte ranks deliberately shuffled
  tiktoken/tokenizer_config.json  `added_tokens_decoder` naming some of the 256 specials, as Kimi ships it
  hf/tokenizer.json               a tiny HF byte-level BPE trained with `tokenizers`
  expected.json                   encode/decode cases computed by Python tiktoken (and `tokenizers` for hf/)

The oracle mirrors Kimi's `TikTokenTokenizer` (spec architecture.md section 8): tiktoken.Encoding(pat_str,
mergeable_ranks=load_tiktoken_bpe(file), special_tokens) with specials at n_base.., names from
added_tokens_decoder defaulting to <|reserved_token_{i}|>, text cut at 400,000 chars and at runs of 25,000
whitespace / non-whitespace chars (Python str.isspace), specials allowed ("all") or disallowed (encoded as text).
Everything is deterministic: fixed seeds, sorted iteration, no timestamps.
"""
import argparse
import base64
import filecmp
import json
import os
import random
import shutil
import sys
import tempfile
from collections import Counter
from pathlib import Path

import regex

# load_tiktoken_bpe caches even local files by path; an empty cache dir turns that off
os.environ["TIKTOKEN_CACHE_DIR"] = ""
import tiktoken  # noqa: E402
from tiktoken.load import load_tiktoken_bpe  # noqa: E402

HERE = Path(__file__).resolve().parent
REPO = HERE.parents[1]

# spec architecture.md section 8, the 8 pieces in order (`&&` is class intersection)
PAT_PIECES = [
    r"""[\p{Han}]+""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?""",
    r"""\p{N}{1,3}""",
    r""" ?[^\s\p{L}\p{N}]+[\r\n]*""",
    r"""\s*[\r\n]+""",
    r"""\s+(?!\S)""",
    r"""\s+""",
]
PAT_STR = "|".join(PAT_PIECES)
NUM_SPECIALS = 256
TIKTOKEN_MAX_ENCODE_CHARS = 400_000
MAX_NO_WHITESPACES_CHARS = 25_000
MAX_MERGES = 3000
MIN_PAIR_COUNT = 1  # the sample is small: let pairs seen once merge too (frequent pairs still come first)

# Named specials at Kimi's offsets from n_base (163584 + k in the real model); the rest stay reserved.
NAMED_SPECIALS = {0: "[BOS]", 1: "[EOS]", 2: "<|im_end|>", 3: "<|im_user|>", 4: "<|im_assistant|>",
                  6: "<|start_header_id|>", 7: "<|end_header_id|>", 9: "[EOT]", 10: "<|im_system|>",
                  17: "<|im_middle|>", 21: "<|media_pad|>", 254: "[UNK]", 255: "[PAD]"}

CORPUS = """\
The quick brown fox jumps over the lazy dog. It's what they're saying: we've seen it, I'm sure, you'll see, he'd know.
THE QUICK BROWN FOX JUMPS OVER THE LAZY DOG! IT'S WHAT THEY'RE SAYING. Don't stop; can't stop; won't stop.
Tokenizers split text into pieces before byte pair encoding merges the most frequent pairs of bytes.
In 2024 the model processed 1234567 tokens per second at 3.14159 accuracy; version 10.2.3 was released on 2025-01-31.
Numbers like 42, 007, 100000 and 999999999 appear in tables, prices ($19.99, €5,00, ¥1200) and dates.
Café, naïve, résumé, façade, jalapeño, Ångström, Øresund, Straße, crème brûlée and déjà vu are borrowed words.
Les élèves étudient la littérature française à l'école; ils aiment les œuvres de Molière et d'Hugo.
Der schnelle braune Fuchs springt über den faulen Hund. Äpfel, Öl und Übungen sind schön.
El niño comió una manzana; ¿dónde está la biblioteca? ¡Qué bueno!
人工智能正在改变世界。我们使用大型语言模型来处理中文文本，包括分词、翻译和问答。
机器学习模型需要大量的数据进行训练，中文字符在这里被当作连续的汉字序列来切分。
北京是中国的首都，上海是最大的城市。今天天气很好，我们去公园散步吧。
日本語のテキストには漢字、ひらがな、カタカナが含まれています。東京は日本の首都です。
私は毎日コーヒーを飲みます。トークナイザーはテキストを分割します。ありがとうございました。
한국어 문장도 포함되어 있습니다. 서울은 대한민국의 수도입니다. 감사합니다, 안녕하세요!
Русский текст тоже нужен: быстрая коричневая лиса прыгает через ленивую собаку. Привет, мир!
Москва — столица России. Токенизатор разбивает текст на части перед кодированием.
النص العربي مهم أيضا: مرحبا بالعالم. القاهرة هي عاصمة مصر. شكرا جزيلا.
Ελληνικά: η γρήγορη καφέ αλεπού πηδάει πάνω από τον τεμπέλη σκύλο.
हिन्दी में नमस्ते दुनिया। यह एक परीक्षण वाक्य है।
Emoji too: 😀 😂 👍 👍🏽 🎉 🚀 ❤️ 👨‍👩‍👧 — and symbols like © ® ™ ° ± × ÷ → ← ≤ ≥ ∞ ∑ √.
def tokenize(text: str) -> list[int]:
    \"\"\"Return the token ids of text.\"\"\"
    ids = []
    for piece in pattern.findall(text):
        ids.extend(encode_piece(piece))  # merge the pairs
    return ids

fn main() {
    let values: Vec<u32> = (0..100).map(|x| x * 2).collect();
    println!("{:?} {}", values, values.len());
    if values.is_empty() { return; } else { std::process::exit(0); }
}

<html><body><div class="main">Hello &amp; welcome!</div></body></html>
{"name": "k31", "layers": [1, 2, 3], "enabled": true, "ratio": 0.75}
SELECT id, name FROM users WHERE age >= 18 ORDER BY name;
\t\tindented with tabs\r\n\t\tand CRLF line endings\r\n\r\n
                    deeply     spaced       text          here
trailing spaces here   \n\n\n   leading spaces there\n
zzzzzzzzzzzzzzzz zzzzzzzzzzzzzzzz zzzzzzzzzzzzzzzz zzzzzzzzzzzzzzzz
................................................................
----------------------------------------------------------------
"""

# Golden strings: each one names the regex piece(s) or splitting rule it exercises.
CASES = [
    ("empty", ""),
    ("han_run", "人工智能正在改变世界"),
    ("han_rare", "龘靐齉爩"),  # not in the training sample: byte fallback
    ("han_mixed", "中文abc中文ABC中文123"),
    ("han_punct", "你好，世界！我们。"),
    # Han next to other letters: only the `&&[^\p{Han}]` intersections keep Han out of pieces 2 and 3
    ("han_after_space_lower", " 中文abc 漢字de"),
    ("han_inside_kana", "の漢字abc カタカナ漢字テスト かな中文"),
    ("han_between_latin", "A漢字b ABC漢字DEF aB中C é中文 Ça中"),
    ("han_contraction", "'中文's 中's X中'RE"),
    ("japanese", "日本語のテキストには漢字、ひらがな、カタカナが含まれています。"),
    ("korean", "안녕하세요 세계, 한국어 문장입니다."),
    ("russian", "Привет, мир! Быстрая коричневая ЛИСА."),
    ("arabic", "مرحبا بالعالم. مَرْحَبًا"),
    ("greek", "Ελληνικά: η γρήγορη ΑΛΕΠΟΥ"),
    ("devanagari_marks", "नमस्ते दुनिया"),
    ("combining_marks", "e\u0301te\u0301 A\u030a n\u0303"),
    ("accented_latin", "Café naïve résumé façade jalapeño Ångström Straße ÆØÅ"),
    ("lower_words", "the quick brown fox"),
    ("upper_words", "THE QUICK BROWN FOX"),
    ("camel_case", "CamelCaseWord iPhone McDonald XMLHttpRequest getHTTPResponse"),
    ("titlecase_lt", "ǅemal ǈubljana ǋoga"),
    ("modifier_lm", "ʰʲ ʰello ˈstress"),
    ("contractions_lower", "it's they're we've I'm you'll he'd don't"),
    ("contractions_upper", "IT'S THEY'RE WE'VE I'M YOU'LL HE'D DON'T"),
    ("contractions_mixed", "It'S they'Re We'vE i'M You'Ll he'D dOn'T"),
    ("contractions_edge", "'s 's's dog's's ''re x'rex 'S 're's"),
    ("contractions_nonascii", "café's NAÏVE'S Привет's"),
    ("digits_short", "1 12 123 1234"),
    ("digits_long", "12345678901234567890123456789012345678901234567890"),
    ("digits_mixed", "v10.2.3 2025-01-31 3.14159 $19.99 1,000,000"),
    ("digits_unicode", "１２３４ ١٢٣٤٥ Ⅻ ²³ ½"),
    ("digits_letters", "abc123def456ghi7890"),
    ("punct_runs", "!!! ??? ... --> <== :: ;; ()[]{}"),
    ("punct_newlines", "end.\nnext!\r\nmore?\n\n\nlast;\r\n\r\n"),
    ("symbols", "© ® ™ ° ± × ÷ → ← ≤ ≥ ∞ ∑ √"),
    ("emoji", "😀 😂 👍 👍🏽 🎉 🚀 ❤️ 👨‍👩‍👧 🦀"),
    ("code_python", "def f(x):\n    return x**2  # square\n\n\nprint(f(3))\n"),
    ("code_rust", "fn main() {\n    let v: Vec<u32> = (0..10).collect();\n    println!(\"{:?}\", v);\n}\n"),
    ("code_json", '{"a": [1, 2, 3], "b": {"c": null}, "d": "\\u00e9"}'),
    ("spaces_before_newline", "line one   \nline two \t \n   \n\n  indented"),
    ("trailing_spaces", "word   "),
    ("leading_spaces", "   word"),
    ("only_spaces", "     "),
    ("only_newlines", "\n\n\n"),
    ("crlf", "a\r\nb\r\n\r\nc\rd\n\re"),
    ("newline_before_letters", "a\nhello\rWorld\r\nTHE\n's\n\nÉcole\rчто"),
    ("tabs", "\t\tindented\twith\ttabs\t"),
    ("unicode_spaces", "a\u00a0b\u3000c\u2003d\u2028e\u0085f\u202fg"),
    ("control_chars", "a\x1cb\x1dc\x1e\x1fd\x00e\x07f\x0bg\x0ch"),
    ("whitespace_then_word", "x  \n  y   z    \t w"),
    ("special_text_im_end", "<|im_end|>"),
    ("special_text_inline", "hello<|im_end|>world [BOS]start[EOS] <|im_user|>user<|im_middle|>hi"),
    ("special_text_reserved", "<|reserved_token_5|> <|reserved_token_200|> <|reserved_token_999|>"),
    ("special_text_partial", "<|im_end| <|im_end <im_end|> [BOS [PAD]]"),
    ("chat_like", "<|im_system|>system<|im_middle|>You are helpful.<|im_end|><|im_user|>user<|im_middle|>Hi!<|im_end|>"
                  "<|im_assistant|>assistant<|im_middle|>"),
    ("html", '<div class="main">Hello &amp; welcome!</div>'),
    ("url", "https://example.com/path?q=1&r=two#frag"),
    ("mixed_paragraph", "In 2024, 人工智能 (AI) changed everything — naïve users said \"it's magic\"; "
                        "Москва и 東京 agreed 👍.\n\tNext: 123456 + ١٢٣ = ?\r\n"),
]

# Long inputs built by repetition, so the golden file stays small: they exercise the 25,000-char run split
# and the 400,000-char cut. Each is a list of (text, count) to concatenate.
RECIPES = [
    ("run_nonspace_30000", [("z", 30000)]),
    ("run_space_30000", [(" ", 30000), ("x", 1)]),
    ("run_newline_26000", [("\n", 26000), ("y", 3)]),
    ("run_mixed_space_kinds", [(" \t", 13000), ("\u3000", 1000), ("word", 1)]),
    ("run_han_26000", [("中文", 13000)]),
    ("run_x1c_separators", [("quick\x1c", 5000)]),  # U+001C is a space to str.isspace only: no 25,000 run
    ("cut_400000", [("zzzzzzzzzzzzzzzz ", 25000), ("end", 1)]),
    ("cut_400000_specials", [("ab<|im_end|>", 40000)]),
]

# Random strings from a pool that mixes every character class of the pattern, including partial
# contraction and special-token fragments.
FUZZ_POOL = (list("abcxyzABCXYZ") + list("0123456789") + ["'", "'s", "'re", "'T", "'LL", "'d", "'ve", "'M"]
             + list(" \t\n\r") + ["\r\n", "  ", "\u3000", "\u00a0"] + list(".,!?-_()[]{}<>|/\\\"#$%&*+=@^~`;:")
             + list("中文字日本語") + list("ひらがなカタカナ") + list("한국어") + list("Привет") + list("مرحبا")
             + list("éüñçÅØß") + ["e\u0301", "\u0303", "ǅ", "ʰ"] + list("١٢３Ⅻ²") + ["😀", "👍🏽", "🚀", "❤️"]
             + ["<|im_end|>", "[BOS]", "<|im_user|>", "<|reserved_token_42|>", "<|", "|>"])
# a second pool for script boundaries around Han (pieces 1-3)
FUZZ_POOL_HAN = list("中文字漢") + list("かなカ") + list("aBcDé") + ["ǅ", "ʰ", "e\u0301", " ", "'s", "'RE", "1", "!"]
FUZZ_COUNT = 160
FUZZ_COUNT_HAN = 60
FUZZ_SEED = 31


def fnv1a64(ids):
    """FNV-1a 64 over the ids as little-endian u32 bytes (tests/tokenizer.rs computes the same)."""
    h = 0xCBF29CE484222325
    for i in ids:
        for b in int(i).to_bytes(4, "little"):
            h ^= b
            h = (h * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def bpe_merges(units, ranks, max_merges):
    """Greedy byte-level BPE on `units` (text -> count); adds each new merged byte string to `ranks`."""
    words = {tuple(bytes([b]) for b in u.encode("utf-8")): c for u, c in sorted(units.items())}
    for _ in range(max_merges):
        pairs = Counter()
        for w, c in words.items():
            for a, b in zip(w, w[1:]):
                pairs[(a, b)] += c
        if not pairs:
            break
        (a, b), count = max(pairs.items(), key=lambda kv: (kv[1], kv[0]))
        if count < MIN_PAIR_COUNT:
            break
        merged = a + b
        if merged not in ranks:  # (ab)c and a(bc) can both occur: one rank per byte string
            ranks[merged] = len(ranks)
        new_words = {}
        for w, c in words.items():
            out, i = [], 0
            while i < len(w):
                if i + 1 < len(w) and w[i] == a and w[i + 1] == b:
                    out.append(merged)
                    i += 2
                else:
                    out.append(w[i])
                    i += 1
            new_words[tuple(out)] = new_words.get(tuple(out), 0) + c
        words = new_words


def train_ranks(corpus, probe_texts):
    """256 single bytes (ranks shuffled); then, with high priority, "boundary" tokens: the two characters
    either side of every piece boundary of `probe_texts` (plus the byte prefixes that let BPE build each
    character); then BPE merges learned on the regex pieces of `corpus`. Correct splitting never puts a
    boundary pair in one piece; a wrong split (Han let into piece 2, `\n` taken as a prefix, 4 digits...)
    does, and BPE then merges the pair first, so the ids expose the wrong split."""
    perm = list(range(256))
    random.Random(FUZZ_SEED).shuffle(perm)
    ranks = {bytes([b]): perm[b] for b in range(256)}
    chars, pairs = set(), set()
    for text in probe_texts:
        pieces = regex.findall(PAT_STR, text, flags=regex.V1)
        for left, right in zip(pieces, pieces[1:]):
            x, y = left[-1].encode(), right[0].encode()
            chars.update((x, y))
            pairs.add(x + y)
    prefixes = {c[:k] for c in chars for k in range(2, len(c) + 1)}
    for tok in sorted(prefixes, key=lambda t: (len(t), t)) + sorted(pairs, key=lambda t: (len(t), t)):
        if tok not in ranks:
            ranks[tok] = len(ranks)
    bpe_merges(Counter(regex.findall(PAT_STR, corpus, flags=regex.V1)), ranks, MAX_MERGES)
    return ranks


def write_rank_file(path, ranks):
    path.parent.mkdir(parents=True, exist_ok=True)
    lines = [f"{base64.b64encode(tok).decode()} {rank}\n" for tok, rank in sorted(ranks.items(), key=lambda kv: kv[1])]
    path.write_text("".join(lines), encoding="ascii")


def kimi_encoding(model_dir):
    """What Kimi's TikTokenTokenizer builds from tiktoken.model + tokenizer_config.json."""
    mergeable_ranks = load_tiktoken_bpe(str(model_dir / "tiktoken.model"))
    n_base = len(mergeable_ranks)
    cfg = json.loads((model_dir / "tokenizer_config.json").read_text(encoding="utf-8"))
    names = {int(i): t["content"] for i, t in cfg["added_tokens_decoder"].items()}
    specials = {names.get(i, f"<|reserved_token_{i}|>"): i for i in range(n_base, n_base + NUM_SPECIALS)}
    enc = tiktoken.Encoding(name="k31_golden", pat_str=PAT_STR, mergeable_ranks=mergeable_ranks,
                            special_tokens=specials)
    return enc, n_base, specials


def split_whitespaces_or_nonwhitespaces(s, max_len, isspace=str.isspace):
    """Kimi's _split_whitespaces_or_nonwhitespaces, verbatim logic."""
    current_slice_len = 0
    current_slice_is_space = isspace(s[0]) if len(s) > 0 else False
    slice_start = 0
    for i in range(len(s)):
        is_now_space = isspace(s[i])
        if current_slice_is_space ^ is_now_space:
            current_slice_len = 1
            current_slice_is_space = is_now_space
        else:
            current_slice_len += 1
            if current_slice_len > max_len:
                yield s[slice_start:i]
                slice_start = i
                current_slice_len = 1
    yield s[slice_start:]


def kimi_encode(enc, text, allow_special):
    substrs = (sub for i in range(0, len(text), TIKTOKEN_MAX_ENCODE_CHARS)
               for sub in split_whitespaces_or_nonwhitespaces(text[i:i + TIKTOKEN_MAX_ENCODE_CHARS],
                                                              MAX_NO_WHITESPACES_CHARS))
    ids = []
    for sub in substrs:
        if allow_special:
            ids.extend(enc.encode(sub, allowed_special="all"))
        else:
            ids.extend(enc.encode(sub, disallowed_special=()))
    return ids


def fuzz_strings():
    rng = random.Random(FUZZ_SEED)
    out = ["".join(rng.choice(FUZZ_POOL) for _ in range(rng.randint(1, 24))) for _ in range(FUZZ_COUNT)]
    return out + ["".join(rng.choice(FUZZ_POOL_HAN) for _ in range(rng.randint(2, 12))) for _ in range(FUZZ_COUNT_HAN)]


def train_hf(out_dir):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=700, special_tokens=["<|endoftext|>", "<|im_end|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator(CORPUS.splitlines(keepends=True), trainer)
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / "tokenizer.json"
    tok.save(str(path))
    return Tokenizer.from_file(str(path))


def generate(out):
    tk_dir = out / "tiktoken"
    ranks = train_ranks(CORPUS, [CORPUS] + [t for _, t in CASES] + fuzz_strings())
    write_rank_file(tk_dir / "tiktoken.model", ranks)
    n_base = len(ranks)
    added = {str(n_base + k): {"content": name, "lstrip": False, "normalized": False, "rstrip": False,
                               "single_word": False, "special": True} for k, name in sorted(NAMED_SPECIALS.items())}
    (tk_dir / "tokenizer_config.json").write_text(json.dumps({"added_tokens_decoder": added}, indent=1,
                                                             ensure_ascii=False) + "\n", encoding="utf-8")
    enc, n_base2, specials = kimi_encoding(tk_dir)
    assert n_base2 == n_base

    cases = []
    texts = [(n, t) for n, t in CASES] + [(f"fuzz_{i:03d}", s) for i, s in enumerate(fuzz_strings())]
    for name, text in texts:
        for allow in (False, True):
            ids = kimi_encode(enc, text, allow)
            assert enc.decode(ids) == text, name  # lossless either way
            cases.append({"name": name, "allow_special": allow, "text": text, "ids": ids})
    long_cases = []
    for name, recipe in RECIPES:
        text = "".join(s * n for s, n in recipe)
        for allow in (False, True):
            ids = kimi_encode(enc, text, allow)
            assert enc.decode(ids) == text, name
            long_cases.append({"name": name, "allow_special": allow, "recipe": [[s, n] for s, n in recipe],
                               "chars": len(text), "n_ids": len(ids), "fnv1a64": fnv1a64(ids),
                               "head": ids[:32], "tail": ids[-32:]})
    # the cut and run splits must change the result, or the cases would not test them
    for name, text in (("25,000-run", "z" * 30000), ("400,000-char", "zzzzzzzzzzzzzzzz " * 25000)):
        assert enc.encode(text, disallowed_special=()) != kimi_encode(enc, text, False), f"{name} split made no difference"
    # U+001C..U+001F are spaces to str.isspace but not to Unicode White_Space: the case must tell them apart
    text = "quick\x1c" * 5000
    white_space = [enc.encode(p, disallowed_special=()) for p in
                   split_whitespaces_or_nonwhitespaces(text, MAX_NO_WHITESPACES_CHARS, lambda c: c.isspace() and c not in "\x1c\x1d\x1e\x1f")]
    assert sum(white_space, []) != kimi_encode(enc, text, False), "U+001C case made no difference"

    # decode: ids whose byte concatenation is not valid UTF-8 (split characters, stray bytes) and specials
    byte_id = {tok[0]: r for tok, r in ranks.items() if len(tok) == 1}
    zhong = "中".encode()  # e4 b8 ad
    decode_ids = [
        [byte_id[zhong[0]], byte_id[zhong[1]]],  # incomplete character at the end
        [byte_id[zhong[0]], byte_id[zhong[1]], byte_id[zhong[2]]],  # completed across 3 tokens
        [byte_id[0xFF], byte_id[0xFE], byte_id[ord("a")]],  # bytes never valid in UTF-8
        [byte_id[zhong[0]], byte_id[ord("a")], byte_id[zhong[1]], byte_id[zhong[2]]],  # interrupted
        [byte_id[0xF0], byte_id[0x9F], byte_id[0x98]],  # 3 of 4 bytes of an emoji
        [byte_id[0xED], byte_id[0xA0], byte_id[0x80]],  # encoded surrogate: invalid
        [byte_id[0xC0], byte_id[0xAF]],  # overlong
        [specials["[BOS]"], *enc.encode("hi"), specials["<|im_end|>"], n_base + 100],
        kimi_encode(enc, "人工智能 😀 Привет", False),
    ]
    # tokens that end inside a character, from real encodings
    for text in ("龘靐", "😀🚀", "مَرْحَبًا"):
        ids = kimi_encode(enc, text, False)
        for k in range(1, len(ids)):
            if not _valid_utf8(enc.decode_bytes(ids[:k])):
                decode_ids.append(ids[:k])
                break
    decode = [{"ids": ids, "bytes_hex": enc.decode_bytes(ids).hex(), "text": enc.decode(ids)} for ids in decode_ids]

    hf = train_hf(out / "hf")
    hf_cases = []
    for name, text in [(n, t) for n, t in CASES if n in HF_CASES] + [(f"fuzz_{i:03d}", s)
                                                                     for i, s in enumerate(fuzz_strings()[:40])]:
        for allow in (False, True):
            hf.encode_special_tokens = not allow
            ids = hf.encode(text, add_special_tokens=False).ids
            hf_cases.append({"name": name, "allow_special": allow, "text": text, "ids": ids,
                             "decoded": hf.decode(ids, skip_special_tokens=False)})
    hf.encode_special_tokens = False

    expected = {
        "about": "written by tools/reference/make_tokenizer_goldens.py; oracle: Python tiktoken "
                 f"{tiktoken.__version__} (Kimi TikTokenTokenizer logic), tokenizers for hf/",
        "pat_str": PAT_STR,
        "n_base": n_base,
        "vocab_size": n_base + NUM_SPECIALS,
        "specials": {name: i for name, i in sorted(specials.items(), key=lambda kv: kv[1])},
        "cases": cases,
        "long_cases": long_cases,
        "decode": decode,
        "hf": {"vocab_size": hf.get_vocab_size(with_added_tokens=True),
               "specials": {t.content: i for i, t in sorted(hf.get_added_tokens_decoder().items()) if t.special},
               "cases": hf_cases},
    }
    (out / "expected.json").write_text(json.dumps(expected, ensure_ascii=False, indent=None, separators=(",", ":"))
                                       + "\n", encoding="utf-8")


HF_CASES = {"empty", "lower_words", "camel_case", "contractions_mixed", "digits_long", "han_run", "emoji",
            "code_python", "crlf", "special_text_im_end", "special_text_inline", "mixed_paragraph", "accented_latin"}


def _valid_utf8(b):
    try:
        b.decode("utf-8")
        return True
    except UnicodeDecodeError:
        return False


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--out", type=Path, default=REPO / "tests" / "golden" / "tokenizer")
    ap.add_argument("--check", action="store_true")
    a = ap.parse_args()
    if not a.check:
        generate(a.out)
        return
    with tempfile.TemporaryDirectory() as d:
        d = Path(d)
        generate(d)
        bad = []
        for p in sorted(q for q in d.rglob("*") if q.is_file()):
            rel = p.relative_to(d)
            if not (a.out / rel).is_file() or not filecmp.cmp(p, a.out / rel, shallow=False):
                bad.append(str(rel))
        if bad:
            print("differs from the committed goldens:", *bad, sep="\n  ")
            sys.exit(1)
        print("tokenizer goldens reproduce byte for byte")


if __name__ == "__main__":
    main()
