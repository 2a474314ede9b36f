//! Text <-> token ids. Two formats (spec architecture.md section 8):
//!
//! * Kimi's `tiktoken.model` (`<base64 bytes> <rank>` per line) with the K3 pre-tokenisation regex and 256
//!   specials after the last rank, named by `tokenizer_config.json` `added_tokens_decoder` (unnamed ones are
//!   `<|reserved_token_{id}|>`). Encoding mirrors Kimi's `TikTokenTokenizer` exactly, including its input
//!   splitting, so ids match Python tiktoken (tests/tokenizer.rs checks the goldens).
//! * HF `tokenizer.json` through the `tokenizers` crate.
//!
//! Decoding is lossy like Python's (`errors="replace"`); [`Tokenizer::decode_bytes`] gives the raw bytes and
//! [`Utf8Stream`] turns a stream of token bytes into text without splitting a character.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};

use base64::Engine as _;

/// The K3 pre-tokenisation regex: the 8 pieces of spec section 8, in order (`&&` is class intersection).
pub const KIMI_PATTERN: &str = concat!(
    r"[\p{Han}]+",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]+[\p{Ll}\p{Lm}\p{Lo}\p{M}&&[^\p{Han}]]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?",
    r"|\p{N}{1,3}",
    r"| ?[^\s\p{L}\p{N}]+[\r\n]*",
    r"|\s*[\r\n]+",
    r"|\s+(?!\S)",
    r"|\s+",
);
/// Specials reserved after the last rank (ids n_base..n_base+256).
pub const NUM_SPECIALS: u32 = 256;
/// Kimi cuts the text into pieces of at most this many chars before BPE.
pub const MAX_ENCODE_CHARS: usize = 400_000;
/// ... and each piece so that no run of whitespace / non-whitespace chars is longer than this.
pub const MAX_RUN_CHARS: usize = 25_000;

#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("no tokenizer in {}: expected tiktoken.model (+ optional tokenizer_config.json) or tokenizer.json", dir.display())]
    NotFound { dir: PathBuf },
    #[error("cannot read {}: {source}", path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{}, line {line}: {msg}", path.display())]
    Malformed {
        path: PathBuf,
        line: usize,
        msg: String,
    },
    #[error("{}: {msg}", path.display())]
    Invalid { path: PathBuf, msg: String },
    #[error("token id {id} is outside the vocabulary (size {vocab_size})")]
    UnknownId { id: u32, vocab_size: usize },
    #[error("encoding failed: {0}")]
    Encode(String),
    #[error("decoding failed: {0}")]
    Decode(String),
}

pub type Result<T> = std::result::Result<T, TokenizerError>;

enum Backend {
    Tiktoken(Box<tiktoken_rs::CoreBPE>),
    Hf {
        /// specials in the text become special ids
        allow: Box<tokenizers::Tokenizer>,
        /// the same with `encode_special_tokens` set: specials in the text are ordinary text
        plain: Box<tokenizers::Tokenizer>,
    },
}

pub struct Tokenizer {
    backend: Backend,
    /// bytes of every id (a special's bytes are its name); None for ids with no token (sparse HF vocabs)
    token_bytes: Vec<Option<Box<[u8]>>>,
    specials: HashMap<String, u32>,
    special_names: BTreeMap<u32, String>,
}

impl fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokenizer")
            .field("kind", &self.kind())
            .field("vocab_size", &self.vocab_size())
            .field("specials", &self.specials.len())
            .finish()
    }
}

impl Tokenizer {
    /// The tokenizer of a model directory: `tiktoken.model` (+ `tokenizer_config.json` when present), else
    /// `tokenizer.json`.
    pub fn from_dir(dir: impl AsRef<Path>) -> Result<Self> {
        let dir = dir.as_ref();
        let tiktoken = dir.join("tiktoken.model");
        if tiktoken.is_file() {
            let config = dir.join("tokenizer_config.json");
            return Self::from_tiktoken(&tiktoken, config.is_file().then_some(config.as_path()));
        }
        let hf = dir.join("tokenizer.json");
        if hf.is_file() {
            return Self::from_hf_file(&hf);
        }
        Err(TokenizerError::NotFound {
            dir: dir.to_path_buf(),
        })
    }

    /// Kimi's format: the rank file and optionally the `tokenizer_config.json` naming the specials.
    pub fn from_tiktoken(model: &Path, config: Option<&Path>) -> Result<Self> {
        let text = read(model)?;
        let ranks = parse_ranks(model, &text)?;
        let n_base = ranks.len() as u32;
        let named = match config {
            Some(path) => special_names_from_config(path, n_base)?,
            None => HashMap::new(),
        };
        let mut specials = HashMap::new();
        let mut special_names = BTreeMap::new();
        for id in n_base..n_base + NUM_SPECIALS {
            let name = named
                .get(&id)
                .cloned()
                .unwrap_or_else(|| format!("<|reserved_token_{id}|>"));
            if let Some(other) = specials.insert(name.clone(), id) {
                let path = config.unwrap_or(model).to_path_buf();
                return Err(TokenizerError::Invalid {
                    path,
                    msg: format!("special token name `{name}` is used by ids {other} and {id}"),
                });
            }
            special_names.insert(id, name);
        }
        let mut token_bytes: Vec<Option<Box<[u8]>>> = vec![None; (n_base + NUM_SPECIALS) as usize];
        for (bytes, &rank) in &ranks {
            token_bytes[rank as usize] = Some(bytes.clone().into_boxed_slice());
        }
        for (&id, name) in &special_names {
            token_bytes[id as usize] = Some(name.as_bytes().into());
        }
        // CoreBPE wants its own hash map type; collect() infers it from the signature
        let bpe = tiktoken_rs::CoreBPE::new(
            ranks.into_iter().collect(),
            specials.clone().into_iter().collect(),
            KIMI_PATTERN,
        )
        .map_err(|e| TokenizerError::Invalid {
            path: model.to_path_buf(),
            msg: format!("building the BPE: {e}"),
        })?;
        Ok(Self {
            backend: Backend::Tiktoken(Box::new(bpe)),
            token_bytes,
            specials,
            special_names,
        })
    }

    /// A HF `tokenizer.json`. Encoding never adds BOS/EOS (the caller decides, as with tiktoken).
    pub fn from_hf_file(path: &Path) -> Result<Self> {
        let bytes = std::fs::read(path).map_err(|source| TokenizerError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let allow =
            tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| TokenizerError::Invalid {
                path: path.to_path_buf(),
                msg: e.to_string(),
            })?;
        let mut plain = allow.clone();
        plain.set_encode_special_tokens(true);

        let vocab = allow.get_vocab(true);
        let vocab_size = vocab.values().map(|&id| id as usize + 1).max().unwrap_or(0);
        let added = allow.get_added_tokens_decoder();
        let mut specials = HashMap::new();
        let mut special_names = BTreeMap::new();
        for (&id, tok) in &added {
            if tok.special {
                specials.insert(tok.content.clone(), id);
                special_names.insert(id, tok.content.clone());
            }
        }
        // byte-level BPE stores bytes as GPT-2's printable chars: map them back for decode_bytes
        let byte_level = allow
            .get_decoder()
            .and_then(|d| serde_json::to_string(d).ok())
            .is_some_and(|j| j.contains("\"ByteLevel\""));
        let from_char = gpt2_char_to_byte();
        let mut token_bytes: Vec<Option<Box<[u8]>>> = vec![None; vocab_size];
        for (id, slot) in token_bytes.iter_mut().enumerate() {
            let id = id as u32;
            *slot = if let Some(tok) = added.get(&id) {
                Some(tok.content.as_bytes().into())
            } else {
                allow.id_to_token(id).map(|tok| {
                    let mapped: Option<Vec<u8>> = if byte_level {
                        tok.chars().map(|c| from_char.get(&c).copied()).collect()
                    } else {
                        None
                    };
                    mapped
                        .unwrap_or_else(|| tok.into_bytes())
                        .into_boxed_slice()
                })
            };
        }
        Ok(Self {
            backend: Backend::Hf {
                allow: Box::new(allow),
                plain: Box::new(plain),
            },
            token_bytes,
            specials,
            special_names,
        })
    }

    /// "tiktoken" or "tokenizer.json".
    pub fn kind(&self) -> &'static str {
        match self.backend {
            Backend::Tiktoken(_) => "tiktoken",
            Backend::Hf { .. } => "tokenizer.json",
        }
    }

    /// Number of ids (base ranks + specials).
    pub fn vocab_size(&self) -> usize {
        self.token_bytes.len()
    }

    /// Token ids of `text`. With `allow_special` the text of a special token (e.g. `<|im_end|>`) becomes its
    /// id; without it, it is ordinary text (how user text is encoded in chat rendering). No BOS is added.
    pub fn encode(&self, text: &str, allow_special: bool) -> Result<Vec<u32>> {
        match &self.backend {
            Backend::Tiktoken(bpe) => {
                let allowed: HashSet<&str> = if allow_special {
                    self.specials.keys().map(String::as_str).collect()
                } else {
                    HashSet::new()
                };
                let mut ids = Vec::with_capacity(text.len() / 3);
                for piece in split_for_bpe(text, MAX_ENCODE_CHARS, MAX_RUN_CHARS) {
                    let (part, _) = bpe
                        .encode(piece, &allowed)
                        .map_err(|e| TokenizerError::Encode(e.to_string()))?;
                    ids.extend(part);
                }
                Ok(ids)
            }
            Backend::Hf { allow, plain } => {
                let tk = if allow_special { allow } else { plain };
                let enc = tk
                    .encode(text, false)
                    .map_err(|e| TokenizerError::Encode(e.to_string()))?;
                Ok(enc.get_ids().to_vec())
            }
        }
    }

    /// Text of `ids`; bytes that are not valid UTF-8 (a character split at the end, stray bytes) become
    /// U+FFFD, as Python's `decode(errors="replace")`. Specials decode to their names.
    pub fn decode(&self, ids: &[u32]) -> Result<String> {
        match &self.backend {
            Backend::Tiktoken(_) => {
                Ok(String::from_utf8_lossy(&self.decode_bytes(ids)?).into_owned())
            }
            Backend::Hf { allow, .. } => {
                self.check_ids(ids)?;
                allow
                    .decode(ids, false)
                    .map_err(|e| TokenizerError::Decode(e.to_string()))
            }
        }
    }

    /// Raw bytes of `ids` (what streaming output feeds to a [`Utf8Stream`]). For a `tokenizer.json` whose
    /// decoder is not byte-level these are the token strings' bytes, without decoder post-processing.
    pub fn decode_bytes(&self, ids: &[u32]) -> Result<Vec<u8>> {
        let mut out = Vec::with_capacity(ids.len() * 4);
        for &id in ids {
            out.extend_from_slice(self.token_bytes(id)?);
        }
        Ok(out)
    }

    /// Bytes of one token.
    pub fn token_bytes(&self, id: u32) -> Result<&[u8]> {
        self.token_bytes
            .get(id as usize)
            .and_then(|b| b.as_deref())
            .ok_or(TokenizerError::UnknownId {
                id,
                vocab_size: self.vocab_size(),
            })
    }

    /// Printable text of one token for display (the viewer's hover): its UTF-8 text, with bytes that are
    /// not valid UTF-8 on their own (part of a split character) written as `\xNN`.
    pub fn token_text(&self, id: u32) -> Result<String> {
        let bytes = self.token_bytes(id)?;
        let mut s = String::with_capacity(bytes.len());
        for chunk in bytes.utf8_chunks() {
            s.push_str(chunk.valid());
            for b in chunk.invalid() {
                s.push_str(&format!("\\x{b:02X}"));
            }
        }
        Ok(s)
    }

    /// Id of a special token by name, e.g. `[BOS]`, `<|im_end|>`, `<|reserved_token_163700|>`.
    pub fn special_id(&self, name: &str) -> Option<u32> {
        self.specials.get(name).copied()
    }

    /// Name of a special id.
    pub fn special_name(&self, id: u32) -> Option<&str> {
        self.special_names.get(&id).map(String::as_str)
    }

    pub fn is_special(&self, id: u32) -> bool {
        self.special_names.contains_key(&id)
    }

    /// All specials, by id.
    pub fn specials(&self) -> impl Iterator<Item = (u32, &str)> {
        self.special_names
            .iter()
            .map(|(&id, name)| (id, name.as_str()))
    }

    fn check_ids(&self, ids: &[u32]) -> Result<()> {
        ids.iter()
            .try_for_each(|&id| self.token_bytes(id).map(|_| ()))
    }
}

/// Holds back the bytes of a character split across tokens, so streamed text never shows a spurious U+FFFD.
/// The concatenation of every `push` and the final `finish` equals the lossy decode of all bytes.
#[derive(Debug, Default)]
pub struct Utf8Stream {
    pending: Vec<u8>,
}

impl Utf8Stream {
    pub fn new() -> Self {
        Self::default()
    }

    /// Add bytes; returns the text that is complete now.
    pub fn push(&mut self, bytes: &[u8]) -> String {
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut done = 0;
        for chunk in self.pending.utf8_chunks() {
            out.push_str(chunk.valid());
            done += chunk.valid().len();
            let bad = chunk.invalid();
            if bad.is_empty() {
                continue;
            }
            // an unfinished sequence at the very end may still be completed by the next token
            let at_end = done + bad.len() == self.pending.len();
            if at_end && std::str::from_utf8(bad).is_err_and(|e| e.error_len().is_none()) {
                break;
            }
            out.push(char::REPLACEMENT_CHARACTER);
            done += bad.len();
        }
        self.pending.drain(..done);
        out
    }

    /// End of stream: whatever is held back, lossily.
    pub fn finish(&mut self) -> String {
        let s = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        s
    }
}

fn read(path: &Path) -> Result<Vec<u8>> {
    std::fs::read(path).map_err(|source| TokenizerError::Io {
        path: path.to_path_buf(),
        source,
    })
}

/// Parse `<base64 bytes> <rank>` lines (blank lines skipped, as `load_tiktoken_bpe`). The ranks must be
/// exactly 0..n (the specials follow at n) and include every single byte, or BPE could not encode all text.
fn parse_ranks(path: &Path, text: &[u8]) -> Result<HashMap<Vec<u8>, u32>> {
    let bad = |line: usize, msg: String| TokenizerError::Malformed {
        path: path.to_path_buf(),
        line,
        msg,
    };
    let mut ranks: HashMap<Vec<u8>, u32> = HashMap::new();
    let mut rank_line: HashMap<u32, usize> = HashMap::new();
    for (i, raw) in text.split(|&b| b == b'\n').enumerate() {
        let line = i + 1;
        let raw = raw.strip_suffix(b"\r").unwrap_or(raw);
        if raw.is_empty() {
            continue;
        }
        let fields: Vec<&[u8]> = raw
            .split(|b| b.is_ascii_whitespace())
            .filter(|f| !f.is_empty())
            .collect();
        let [tok, rank] = fields[..] else {
            return Err(bad(
                line,
                format!(
                    "expected `<base64 token> <rank>`, found {} fields",
                    fields.len()
                ),
            ));
        };
        let bytes = base64::engine::general_purpose::STANDARD
            .decode(tok)
            .map_err(|e| bad(line, format!("token is not valid base64: {e}")))?;
        if bytes.is_empty() {
            return Err(bad(line, "empty token".into()));
        }
        let rank_str = String::from_utf8_lossy(rank);
        let rank: u32 = rank_str.parse().map_err(|_| {
            bad(
                line,
                format!("rank `{rank_str}` is not a non-negative integer"),
            )
        })?;
        if let Some(first) = rank_line.insert(rank, line) {
            return Err(bad(
                line,
                format!("rank {rank} is already used on line {first}"),
            ));
        }
        if let Some(other) = ranks.insert(bytes.clone(), rank) {
            return Err(bad(
                line,
                format!("token {} already has rank {other}", hex(&bytes)),
            ));
        }
    }
    let n = ranks.len();
    if n == 0 {
        return Err(TokenizerError::Invalid {
            path: path.to_path_buf(),
            msg: "no ranks in the file".into(),
        });
    }
    if let Some((&rank, &line)) = rank_line
        .iter()
        .filter(|&(&r, _)| r as usize >= n)
        .min_by_key(|&(_, &l)| l)
    {
        return Err(bad(
            line,
            format!("rank {rank} is not below the number of ranks ({n}): ranks must be 0..{n}"),
        ));
    }
    if let Some(b) = (0..=255u8).find(|b| !ranks.contains_key(&[*b][..])) {
        return Err(TokenizerError::Invalid {
            path: path.to_path_buf(),
            msg: format!("no rank for the single byte 0x{b:02X}: byte-level BPE needs all 256"),
        });
    }
    if n as u64 + NUM_SPECIALS as u64 > u32::MAX as u64 {
        return Err(TokenizerError::Invalid {
            path: path.to_path_buf(),
            msg: format!("{n} ranks do not fit u32 ids"),
        });
    }
    Ok(ranks)
}

/// Names of the specials from `added_tokens_decoder` (`{"163584": {"content": "[BOS]", ...}, ...}`); entries
/// outside the special range are ignored, as Kimi's tokenizer does.
fn special_names_from_config(path: &Path, n_base: u32) -> Result<HashMap<u32, String>> {
    let invalid = |msg: String| TokenizerError::Invalid {
        path: path.to_path_buf(),
        msg,
    };
    let text = read(path)?;
    let json: serde_json::Value =
        serde_json::from_slice(&text).map_err(|e| invalid(format!("not valid JSON: {e}")))?;
    let mut names = HashMap::new();
    let Some(decoder) = json.get("added_tokens_decoder") else {
        return Ok(names);
    };
    let decoder = decoder
        .as_object()
        .ok_or_else(|| invalid("`added_tokens_decoder` is not an object".into()))?;
    for (key, tok) in decoder {
        let id: u32 = key.parse().map_err(|_| {
            invalid(format!(
                "`added_tokens_decoder` key `{key}` is not a token id"
            ))
        })?;
        let content = tok.get("content").and_then(|c| c.as_str()).ok_or_else(|| {
            invalid(format!(
                "`added_tokens_decoder.{key}.content` is missing or not a string"
            ))
        })?;
        if content.is_empty() {
            return Err(invalid(format!(
                "`added_tokens_decoder.{key}.content` is empty"
            )));
        }
        if (n_base..n_base + NUM_SPECIALS).contains(&id) {
            names.insert(id, content.to_string());
        }
    }
    Ok(names)
}

/// Kimi's input splitting: pieces of at most `max_chars` chars, each cut again so that no run of whitespace
/// or non-whitespace chars is longer than `max_run` (whitespace as Python's `str.isspace`).
pub fn split_for_bpe(text: &str, max_chars: usize, max_run: usize) -> Vec<&str> {
    let mut out = Vec::new();
    let mut rest = text;
    while !rest.is_empty() {
        let cut = rest
            .char_indices()
            .nth(max_chars)
            .map_or(rest.len(), |(i, _)| i);
        let (chunk, tail) = rest.split_at(cut);
        split_runs(chunk, max_run, &mut out);
        rest = tail;
    }
    out
}

fn split_runs<'a>(s: &'a str, max_run: usize, out: &mut Vec<&'a str>) {
    let mut run_len = 0;
    let mut run_is_space = s.chars().next().is_some_and(py_isspace);
    let mut start = 0;
    for (i, c) in s.char_indices() {
        let space = py_isspace(c);
        if space != run_is_space {
            run_len = 1;
            run_is_space = space;
        } else {
            run_len += 1;
            if run_len > max_run {
                out.push(&s[start..i]);
                start = i;
                run_len = 1;
            }
        }
    }
    out.push(&s[start..]);
}

/// Python's `str.isspace`: Unicode White_Space plus the separators U+001C..U+001F.
fn py_isspace(c: char) -> bool {
    c.is_whitespace() || ('\u{1c}'..='\u{1f}').contains(&c)
}

/// GPT-2's byte <-> printable char table used by byte-level BPE vocabularies, inverted.
fn gpt2_char_to_byte() -> HashMap<char, u8> {
    let printable = |b: u8| (b'!'..=b'~').contains(&b) || (0xA1..=0xAC).contains(&b) || b >= 0xAE;
    let mut map = HashMap::with_capacity(256);
    let mut next = 256u32;
    for b in 0..=255u8 {
        let c = if printable(b) {
            b as u32
        } else {
            next += 1;
            next - 1
        };
        if let Some(c) = char::from_u32(c) {
            map.insert(c, b);
        }
    }
    map
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The regex pieces become visible when every expected piece is one token: a different split would
    /// fall back to single bytes and change the decoded list.
    #[test]
    fn pattern_pieces_with_class_intersection() {
        let pieces = [
            "Hello", " WORLD'S", " they'RE", " ", "123", "4", "中文", "かな", " x", "  \n\n", " y",
            "!!\n",
        ];
        let mut ranks: HashMap<Vec<u8>, u32> = (0..=255u8).map(|b| (vec![b], b as u32)).collect();
        for (i, p) in pieces.iter().enumerate() {
            ranks.insert(p.as_bytes().to_vec(), 256 + i as u32);
        }
        let no_specials = HashMap::<String, u32>::new();
        let bpe = tiktoken_rs::CoreBPE::new(
            ranks.into_iter().collect(),
            no_specials.into_iter().collect(),
            KIMI_PATTERN,
        )
        .unwrap();
        let got: Vec<String> = bpe
            .encode_ordinary("Hello WORLD'S they'RE 1234中文かな x  \n\n y!!\n")
            .into_iter()
            .map(|id| String::from_utf8_lossy(&bpe.decode_bytes(&[id]).unwrap()).into_owned())
            .collect();
        assert_eq!(got, pieces);
    }

    #[test]
    fn split_matches_python_logic() {
        assert!(split_for_bpe("", 10, 3).is_empty());
        assert_eq!(split_for_bpe("abcdefg", 100, 3), vec!["abc", "def", "g"]);
        // as Python: list(_split_whitespaces_or_nonwhitespaces("ab     cd", 2))
        assert_eq!(
            split_for_bpe("ab     cd", 100, 2),
            vec!["ab  ", "  ", " cd"]
        );
        assert_eq!(split_for_bpe("aaaa", 3, 100), vec!["aaa", "a"]);
        // char-based, not byte-based; U+001C counts as space (Python isspace)
        assert_eq!(split_for_bpe("中中中中", 100, 2), vec!["中中", "中中"]);
        assert_eq!(
            split_for_bpe("a\u{1c}\u{1c}\u{1c}b", 100, 2),
            vec!["a\u{1c}\u{1c}", "\u{1c}b"]
        );
    }

    #[test]
    fn stream_holds_back_partial_chars() {
        let bytes = "a中😀b".as_bytes();
        let mut s = Utf8Stream::new();
        let mut out = String::new();
        for b in bytes {
            out.push_str(&s.push(&[*b]));
        }
        out.push_str(&s.finish());
        assert_eq!(out, "a中😀b");
        let mut s = Utf8Stream::new();
        assert_eq!(s.push(&[0xE4, 0xB8]), "");
        assert_eq!(s.push(b"x"), "\u{FFFD}x");
        assert_eq!(s.push(&[0xFF]), "\u{FFFD}");
        assert_eq!(s.push(&[0xF0, 0x9F]), "");
        assert_eq!(s.finish(), "\u{FFFD}");
    }

    #[test]
    fn gpt2_table_is_a_bijection() {
        let m = gpt2_char_to_byte();
        assert_eq!(m.len(), 256);
        assert_eq!(m[&'Ġ'], b' ');
        assert_eq!(m[&'Ċ'], b'\n');
        assert_eq!(m[&'A'], b'A');
    }
}
