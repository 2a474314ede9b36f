//! Tokenizer vs Python tiktoken / tokenizers on the goldens of tools/reference/make_tokenizer_goldens.py
//! (tests/golden/tokenizer/README.md), plus load errors, specials, decoding across split characters.

mod support;

use k31_engine::tokenizer::{KIMI_PATTERN, Tokenizer, TokenizerError, Utf8Stream};
use serde_json::Value;
use std::path::PathBuf;
use std::sync::OnceLock;

fn dir(sub: &str) -> PathBuf {
    support::golden::golden_path("tokenizer").join(sub)
}

fn expected() -> &'static Value {
    static E: OnceLock<Value> = OnceLock::new();
    E.get_or_init(|| support::golden::load_json("tokenizer/expected.json"))
}

fn kimi() -> &'static Tokenizer {
    static T: OnceLock<Tokenizer> = OnceLock::new();
    T.get_or_init(|| Tokenizer::from_dir(dir("tiktoken")).unwrap())
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn fnv1a64(ids: &[u32]) -> String {
    let mut h: u64 = 0xCBF2_9CE4_8422_2325;
    for id in ids {
        for b in id.to_le_bytes() {
            h ^= b as u64;
            h = h.wrapping_mul(0x0100_0000_01B3);
        }
    }
    format!("{h:016x}")
}

#[test]
fn pattern_is_the_goldens_pattern() {
    assert_eq!(expected()["pat_str"].as_str().unwrap(), KIMI_PATTERN);
}

#[test]
fn tiktoken_matches_python_on_every_golden_string() {
    let tok = kimi();
    let e = expected();
    assert_eq!(tok.kind(), "tiktoken");
    assert_eq!(tok.vocab_size() as u64, e["vocab_size"].as_u64().unwrap());
    let mut failures = Vec::new();
    let cases = e["cases"].as_array().unwrap();
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let allow = case["allow_special"].as_bool().unwrap();
        let want = ids(&case["ids"]);
        let got = tok.encode(text, allow).unwrap();
        if got != want {
            failures.push(format!(
                "{} (allow_special={allow}) {text:?}\n  got  {got:?}\n  want {want:?}",
                case["name"]
            ));
            continue;
        }
        assert_eq!(
            tok.decode(&got).unwrap(),
            text,
            "round trip of {}",
            case["name"]
        );
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases differ:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    eprintln!("{} golden strings match Python tiktoken", cases.len());
}

/// Inputs past 25,000-char runs and the 400,000-char cut, rebuilt from their recipes.
#[test]
fn tiktoken_matches_python_on_long_inputs() {
    let tok = kimi();
    for case in expected()["long_cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let text: String = case["recipe"]
            .as_array()
            .unwrap()
            .iter()
            .map(|p| {
                p[0].as_str()
                    .unwrap()
                    .repeat(p[1].as_u64().unwrap() as usize)
            })
            .collect();
        assert_eq!(
            text.chars().count() as u64,
            case["chars"].as_u64().unwrap(),
            "{name}"
        );
        let got = tok
            .encode(&text, case["allow_special"].as_bool().unwrap())
            .unwrap();
        let what = format!("{name} allow_special={}", case["allow_special"]);
        assert_eq!(
            got[..32.min(got.len())],
            ids(&case["head"])[..],
            "{what}: head"
        );
        assert_eq!(
            got[got.len().saturating_sub(32)..],
            ids(&case["tail"])[..],
            "{what}: tail"
        );
        assert_eq!(
            got.len() as u64,
            case["n_ids"].as_u64().unwrap(),
            "{what}: count"
        );
        assert_eq!(
            fnv1a64(&got),
            case["fnv1a64"].as_str().unwrap(),
            "{what}: checksum"
        );
    }
}

#[test]
fn decode_matches_python_across_split_characters() {
    let tok = kimi();
    for case in expected()["decode"].as_array().unwrap() {
        let ids = ids(&case["ids"]);
        let bytes = tok.decode_bytes(&ids).unwrap();
        let hex: String = bytes.iter().map(|b| format!("{b:02x}")).collect();
        assert_eq!(hex, case["bytes_hex"].as_str().unwrap(), "bytes of {ids:?}");
        let want = case["text"].as_str().unwrap();
        assert_eq!(tok.decode(&ids).unwrap(), want, "text of {ids:?}");
        // streaming token by token gives the same text, without a U+FFFD before a character completes
        let mut stream = Utf8Stream::new();
        let mut out = String::new();
        for &id in &ids {
            out.push_str(&stream.push(tok.token_bytes(id).unwrap()));
        }
        out.push_str(&stream.finish());
        assert_eq!(out, want, "streamed text of {ids:?}");
    }
}

#[test]
fn stream_never_emits_replacement_for_valid_text() {
    let tok = kimi();
    for case in expected()["cases"].as_array().unwrap() {
        let text = case["text"].as_str().unwrap();
        let mut stream = Utf8Stream::new();
        let mut out = String::new();
        for id in ids(&case["ids"]) {
            let piece = stream.push(tok.token_bytes(id).unwrap());
            assert!(
                !piece.contains('\u{FFFD}') || text.contains('\u{FFFD}'),
                "{}",
                case["name"]
            );
            out.push_str(&piece);
        }
        out.push_str(&stream.finish());
        assert_eq!(out, text);
    }
}

#[test]
fn specials_follow_the_ranks_with_config_names() {
    let tok = kimi();
    let e = expected();
    let n_base = e["n_base"].as_u64().unwrap() as u32;
    let specials = e["specials"].as_object().unwrap();
    assert_eq!(specials.len(), 256);
    for (name, id) in specials {
        assert_eq!(
            tok.special_id(name),
            Some(id.as_u64().unwrap() as u32),
            "{name}"
        );
    }
    assert_eq!(tok.specials().count(), 256);
    assert_eq!(tok.special_id("[BOS]"), Some(n_base));
    assert_eq!(tok.special_id("<|im_end|>"), Some(n_base + 2));
    let reserved = format!("<|reserved_token_{}|>", n_base + 5);
    assert_eq!(tok.special_id(&reserved), Some(n_base + 5));
    assert_eq!(tok.special_name(n_base + 255), Some("[PAD]"));
    assert!(tok.is_special(n_base) && !tok.is_special(n_base - 1));
    assert_eq!(tok.special_id("<|im_end"), None);

    // allowed: one id; disallowed: the same characters as ordinary BPE
    assert_eq!(tok.encode("<|im_end|>", true).unwrap(), vec![n_base + 2]);
    let plain = tok.encode("<|im_end|>", false).unwrap();
    assert!(
        plain.len() > 1 && plain.iter().all(|&id| id < n_base),
        "{plain:?}"
    );
    assert_eq!(tok.decode(&plain).unwrap(), "<|im_end|>");
    assert_eq!(tok.token_text(n_base + 2).unwrap(), "<|im_end|>");
}

#[test]
fn token_text_and_out_of_vocabulary_ids() {
    let tok = kimi();
    // the single-byte token 0xE4 (first byte of 中) is shown escaped
    let e4 = (0..tok.vocab_size() as u32)
        .find(|&id| tok.token_bytes(id).unwrap() == [0xE4])
        .unwrap();
    assert_eq!(tok.token_text(e4).unwrap(), "\\xE4");
    let a = tok.encode("a", false).unwrap();
    assert_eq!(tok.token_text(a[0]).unwrap(), "a");

    let v = tok.vocab_size() as u32;
    for bad in [v, v + 1, u32::MAX] {
        for err in [
            tok.decode(&[a[0], bad]).unwrap_err(),
            tok.decode_bytes(&[bad]).unwrap_err(),
            tok.token_text(bad).unwrap_err(),
        ] {
            assert!(
                matches!(err, TokenizerError::UnknownId { id, .. } if id == bad),
                "{err}"
            );
            assert!(err.to_string().contains(&bad.to_string()), "{err}");
        }
    }
    assert!(tok.decode(&[]).unwrap().is_empty());
}

#[test]
fn hf_tokenizer_json_matches_python_tokenizers() {
    let tok = Tokenizer::from_dir(dir("hf")).unwrap();
    let e = &expected()["hf"];
    assert_eq!(tok.kind(), "tokenizer.json");
    assert_eq!(tok.vocab_size() as u64, e["vocab_size"].as_u64().unwrap());
    for (name, id) in e["specials"].as_object().unwrap() {
        assert_eq!(
            tok.special_id(name),
            Some(id.as_u64().unwrap() as u32),
            "{name}"
        );
    }
    let cases = e["cases"].as_array().unwrap();
    for case in cases {
        let text = case["text"].as_str().unwrap();
        let allow = case["allow_special"].as_bool().unwrap();
        let want = ids(&case["ids"]);
        assert_eq!(
            tok.encode(text, allow).unwrap(),
            want,
            "{} allow_special={allow} {text:?}",
            case["name"]
        );
        assert_eq!(
            tok.decode(&want).unwrap(),
            case["decoded"].as_str().unwrap(),
            "{}",
            case["name"]
        );
        // byte-level: the raw bytes are the text itself
        assert_eq!(
            tok.decode_bytes(&want).unwrap(),
            text.as_bytes(),
            "{}",
            case["name"]
        );
    }
    let im_end = tok.special_id("<|im_end|>").unwrap();
    assert_eq!(tok.encode("<|im_end|>", true).unwrap(), vec![im_end]);
    assert!(tok.encode("<|im_end|>", false).unwrap().len() > 1);
    let v = tok.vocab_size() as u32;
    assert!(matches!(
        tok.decode(&[v]),
        Err(TokenizerError::UnknownId { .. })
    ));
    eprintln!(
        "{} tokenizer.json cases match Python tokenizers",
        cases.len()
    );
}

// ---- load errors: each names the file and, for the rank file, the line

fn rank_line(bytes: &[u8], rank: u32) -> String {
    use base64::Engine as _;
    format!(
        "{} {rank}\n",
        base64::engine::general_purpose::STANDARD.encode(bytes)
    )
}

/// A valid rank file: 256 single bytes and two merges.
fn base_ranks() -> String {
    let mut s: String = (0..=255u8).map(|b| rank_line(&[b], b as u32)).collect();
    s.push_str(&rank_line(b"ab", 256));
    s.push_str(&rank_line(b"abc", 257));
    s
}

fn load_err(name: &str, ranks: &str, config: Option<&str>) -> String {
    let d = support::scratch(&format!("tokenizer_{name}"));
    std::fs::write(d.join("tiktoken.model"), ranks).unwrap();
    if let Some(c) = config {
        std::fs::write(d.join("tokenizer_config.json"), c).unwrap();
    }
    match Tokenizer::from_dir(&d) {
        Ok(_) => panic!("{name}: loaded a bad tokenizer"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn small_rank_file_loads_and_encodes() {
    let d = support::scratch("tokenizer_ok");
    // CRLF line endings and blank lines are accepted, as load_tiktoken_bpe does
    std::fs::write(
        d.join("tiktoken.model"),
        base_ranks().replace('\n', "\r\n") + "\n\n",
    )
    .unwrap();
    let tok = Tokenizer::from_dir(&d).unwrap();
    assert_eq!(tok.vocab_size(), 258 + 256);
    assert_eq!(tok.encode("abcab", false).unwrap(), vec![257, 256]);
    assert_eq!(tok.special_id("<|reserved_token_258|>"), Some(258));
    assert_eq!(
        tok.encode("<|reserved_token_258|>x", true).unwrap(),
        vec![258, b'x' as u32]
    );
}

#[test]
fn malformed_rank_files_name_the_line() {
    let lines: Vec<String> = base_ranks().lines().map(|l| format!("{l}\n")).collect();
    let with = |line: usize, text: &str| {
        let mut l = lines.clone();
        l[line - 1] = text.to_string();
        l.concat()
    };
    let cases = [
        (
            "fields",
            with(3, "QUJD\n"),
            "line 3: expected `<base64 token> <rank>`, found 1 fields",
        ),
        (
            "fields3",
            with(4, "QUJD 3 4\n"),
            "line 4: expected `<base64 token> <rank>`, found 3 fields",
        ),
        (
            "base64",
            with(5, "!!!! 4\n"),
            "line 5: token is not valid base64",
        ),
        (
            "rank",
            with(6, "BQ== five\n"),
            "line 6: rank `five` is not a non-negative integer",
        ),
        ("negative", with(6, "BQ== -5\n"), "line 6: rank `-5`"),
        (
            "dup_rank",
            with(258, &rank_line(b"abc", 256)),
            "line 258: rank 256 is already used on line 257",
        ),
        (
            "dup_token",
            with(258, &rank_line(b"ab", 257)),
            "line 258: token 6162 already has rank 256",
        ),
        (
            "range",
            with(258, &rank_line(b"abc", 999)),
            "line 258: rank 999 is not below the number of ranks (258)",
        ),
    ];
    for (name, text, want) in cases {
        let err = load_err(name, &text, None);
        assert!(
            err.contains("tiktoken.model") && err.contains(want),
            "{name}: {err}"
        );
    }
    // a missing single byte (rank 65 = 'A' removed, the merges renumbered so the ranks stay 0..n)
    let mut no_a: String = (0..=255u8)
        .filter(|&b| b != b'A')
        .enumerate()
        .map(|(r, b)| rank_line(&[b], r as u32))
        .collect();
    no_a.push_str(&rank_line(b"ab", 255));
    let err = load_err("no_byte", &no_a, None);
    assert!(err.contains("no rank for the single byte 0x41"), "{err}");
    let err = load_err("empty", "", None);
    assert!(err.contains("no ranks"), "{err}");
}

#[test]
fn bad_configs_and_missing_files() {
    let ok = base_ranks();
    let cases = [
        ("json", "{not json", "tokenizer_config.json: not valid JSON"),
        (
            "decoder",
            r#"{"added_tokens_decoder": []}"#,
            "`added_tokens_decoder` is not an object",
        ),
        (
            "key",
            r#"{"added_tokens_decoder": {"x": {"content": "[BOS]"}}}"#,
            "key `x` is not a token id",
        ),
        (
            "content",
            r#"{"added_tokens_decoder": {"258": {"special": true}}}"#,
            "`added_tokens_decoder.258.content` is missing",
        ),
        (
            "empty_name",
            r#"{"added_tokens_decoder": {"258": {"content": ""}}}"#,
            "`added_tokens_decoder.258.content` is empty",
        ),
        (
            "dup_name",
            r#"{"added_tokens_decoder": {"258": {"content": "[X]"}, "300": {"content": "[X]"}}}"#,
            "special token name `[X]` is used by ids 258 and 300",
        ),
    ];
    for (name, config, want) in cases {
        let err = load_err(name, &ok, Some(config));
        assert!(err.contains(want), "{name}: {err}");
    }
    // names outside the special range are ignored (as Kimi's tokenizer); a config without the key is fine
    let d = support::scratch("tokenizer_cfg_ok");
    std::fs::write(d.join("tiktoken.model"), &ok).unwrap();
    std::fs::write(
        d.join("tokenizer_config.json"),
        r#"{"added_tokens_decoder": {"5": {"content": "[Z]"}, "259": {"content": "[E]"}}}"#,
    )
    .unwrap();
    let tok = Tokenizer::from_dir(&d).unwrap();
    assert_eq!(tok.special_id("[Z]"), None);
    assert_eq!(tok.special_id("[E]"), Some(259));
    assert_eq!(tok.special_name(258), Some("<|reserved_token_258|>"));

    let empty = support::scratch("tokenizer_none");
    let err = Tokenizer::from_dir(&empty).unwrap_err();
    assert!(
        matches!(err, TokenizerError::NotFound { .. })
            && err.to_string().contains("tiktoken.model"),
        "{err}"
    );
    let err = Tokenizer::from_dir(empty.join("missing"))
        .unwrap_err()
        .to_string();
    assert!(err.contains("no tokenizer in"), "{err}");
    let d = support::scratch("tokenizer_bad_hf");
    std::fs::write(d.join("tokenizer.json"), "{\"model\": 3}").unwrap();
    let err = Tokenizer::from_dir(&d).unwrap_err().to_string();
    assert!(err.contains("tokenizer.json"), "{err}");
}

/// Kimi's layout at full size: 163,584 ranks, specials 163584..163839 (spec section 8: bos 163584,
/// eos 163586, pad 163839), shared across threads.
#[test]
fn kimi_sized_vocabulary() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<Tokenizer>();
    let mut ranks = String::with_capacity(163_584 * 12);
    let mut n = 0u32;
    'fill: for len in 1..=3usize {
        let count = 1usize << (8 * len);
        for i in 0..count {
            if n == 163_584 {
                break 'fill;
            }
            let bytes = &(i as u32).to_be_bytes()[4 - len..];
            ranks.push_str(&rank_line(bytes, n));
            n += 1;
        }
    }
    let d = support::scratch("tokenizer_kimi_size");
    std::fs::write(d.join("tiktoken.model"), ranks).unwrap();
    let config = r#"{"added_tokens_decoder": {"163584": {"content": "[BOS]"}, "163585": {"content": "[EOS]"},
        "163586": {"content": "<|im_end|>"}, "163839": {"content": "[PAD]"}}}"#;
    std::fs::write(d.join("tokenizer_config.json"), config).unwrap();
    let tok = Tokenizer::from_dir(&d).unwrap();
    assert_eq!(tok.vocab_size(), 163_840);
    assert_eq!(tok.special_id("[BOS]"), Some(163_584));
    assert_eq!(tok.special_id("<|im_end|>"), Some(163_586));
    assert_eq!(tok.special_id("[PAD]"), Some(163_839));
    assert_eq!(tok.special_name(163_700), Some("<|reserved_token_163700|>"));
    let ids = std::thread::scope(|s| {
        let a = s.spawn(|| tok.encode("[BOS]hi<|im_end|>", true).unwrap());
        let b = s.spawn(|| tok.encode("[BOS]hi<|im_end|>", false).unwrap());
        (a.join().unwrap(), b.join().unwrap())
    });
    assert_eq!(
        ids.0,
        vec![163_584, 256 + 256 * (b'h' as u32) + b'i' as u32, 163_586]
    );
    assert_eq!(tok.decode(&ids.1).unwrap(), "[BOS]hi<|im_end|>");
}
