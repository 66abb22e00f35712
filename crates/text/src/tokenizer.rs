//! The tokenizer of a model folder (`tokenizer.json` through the `tokenizers` crate) and the
//! end-of-sequence ids the folder declares across its config files.

use serde_json::Value;
use std::fmt;
use std::path::{Path, PathBuf};

/// Everything that can go wrong loading or using a tokenizer; each names the file involved.
#[derive(Debug, thiserror::Error)]
pub enum TokenizerError {
    #[error("{}: not found", path.display())]
    Missing { path: PathBuf },
    #[error("{}: cannot read: {source}", path.display())]
    Io { path: PathBuf, source: std::io::Error },
    #[error("{}: invalid JSON: {source}", path.display())]
    Json { path: PathBuf, source: serde_json::Error },
    #[error("{}: not a usable tokenizer: {reason}", path.display())]
    Load { path: PathBuf, reason: String },
    #[error("{}: {what}", path.display())]
    Invalid { path: PathBuf, what: String },
    #[error("{}: cannot encode text: {reason}", path.display())]
    Encode { path: PathBuf, reason: String },
    #[error("{}: cannot decode: {reason}", path.display())]
    Decode { path: PathBuf, reason: String },
}

type Result<T> = std::result::Result<T, TokenizerError>;

/// A loaded `tokenizer.json`. Added tokens (such as `<|im_start|>`) are matched as single
/// tokens wherever they occur in the text, whether or not special tokens are added.
#[derive(Clone)]
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    path: PathBuf,
}

impl fmt::Debug for Tokenizer {
    // The inner tokenizer would print its whole vocabulary.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tokenizer").field("path", &self.path).field("vocab_size", &self.vocab_size()).finish()
    }
}

impl Tokenizer {
    /// Loads `DIR/tokenizer.json`.
    pub fn from_dir(dir: &Path) -> Result<Self> {
        Self::from_file(&dir.join("tokenizer.json"))
    }

    /// Loads a `tokenizer.json` file.
    pub fn from_file(path: &Path) -> Result<Self> {
        if !path.is_file() {
            return Err(TokenizerError::Missing { path: path.to_owned() });
        }
        let bytes = std::fs::read(path).map_err(|source| TokenizerError::Io { path: path.to_owned(), source })?;
        let inner = tokenizers::Tokenizer::from_bytes(&bytes)
            .map_err(|e| TokenizerError::Load { path: path.to_owned(), reason: e.to_string() })?;
        Ok(Self { inner, path: path.to_owned() })
    }

    /// The file this tokenizer came from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Token ids of `text`. `add_special_tokens` runs the tokenizer's post-processor (a BOS for
    /// Llama-style tokenizers); special tokens written in `text` are recognised either way.
    pub fn encode(&self, text: &str, add_special_tokens: bool) -> Result<Vec<u32>> {
        // encode_fast skips the char offsets we never use.
        let encoding = self
            .inner
            .encode_fast(text, add_special_tokens)
            .map_err(|e| TokenizerError::Encode { path: self.path.clone(), reason: e.to_string() })?;
        Ok(encoding.get_ids().to_vec())
    }

    /// Text of `ids`; with `skip_special` the special added tokens are left out.
    /// An id the vocabulary does not hold is an error (the `tokenizers` crate would drop it).
    pub fn decode(&self, ids: &[u32], skip_special: bool) -> Result<String> {
        if let Some(&bad) = ids.iter().find(|&&id| self.inner.id_to_token(id).is_none()) {
            return Err(TokenizerError::Decode {
                path: self.path.clone(),
                reason: format!("token id {bad} is not in the vocabulary (size {})", self.vocab_size()),
            });
        }
        self.inner
            .decode(ids, skip_special)
            .map_err(|e| TokenizerError::Decode { path: self.path.clone(), reason: e.to_string() })
    }

    /// The id of a token given in its vocabulary spelling (`<|im_end|>`, `Ġthe`).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The vocabulary spelling of an id.
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// Every id's text as the bytes the decoder writes for it, and whether it is a special
    /// added token (which text never holds): what a grammar engine matches tokens by.
    /// Byte-level vocabularies (GPT-2's byte-to-character map) and SentencePiece ones (`▁` for
    /// a space, `<0xNN>` byte tokens) are read as their decoders read them; any other token is
    /// its spelling. An id the vocabulary skips is empty.
    pub fn token_bytes(&self) -> Vec<(Vec<u8>, bool)> {
        let decoder = self.inner.get_decoder().and_then(|d| serde_json::to_string(d).ok()).unwrap_or_default();
        let byte_level = decoder.contains("\"ByteLevel\"");
        let unicode_to_byte = byte_level.then(gpt2_byte_map);
        let added = self.inner.get_added_tokens_decoder();
        (0..self.vocab_size() as u32)
            .map(|id| {
                if let Some(token) = added.get(&id) {
                    return (token.content.as_bytes().to_vec(), token.special);
                }
                let Some(spelling) = self.inner.id_to_token(id) else { return (Vec::new(), false) };
                if let Some(map) = &unicode_to_byte {
                    if let Some(bytes) = spelling.chars().map(|c| map.get(&c).copied()).collect::<Option<Vec<u8>>>() {
                        return (bytes, false);
                    }
                    return (spelling.into_bytes(), false);
                }
                if let Some(hex) = spelling.strip_prefix("<0x").and_then(|h| h.strip_suffix('>'))
                    && hex.len() == 2
                    && let Ok(byte) = u8::from_str_radix(hex, 16)
                {
                    return (vec![byte], false);
                }
                (spelling.replace('\u{2581}', " ").into_bytes(), false)
            })
            .collect()
    }

    /// Number of tokens including added tokens. The model's embedding may have more rows
    /// (padding); ids at or beyond this are not decodable.
    pub fn vocab_size(&self) -> usize {
        self.inner.get_vocab_size(true)
    }
}

/// GPT-2's byte-level alphabet, reversed: the printable bytes stand for themselves and the
/// others (space, control bytes, ...) for the characters from U+0100 on, in byte order.
fn gpt2_byte_map() -> std::collections::HashMap<char, u8> {
    let printable = |b: u8| matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
    let mut next = 0x100u32;
    (0..=255u8)
        .map(|b| {
            if printable(b) {
                (char::from(b), b)
            } else {
                let c = char::from_u32(next).unwrap_or('\0');
                next += 1;
                (c, b)
            }
        })
        .collect()
}

/// Reads a JSON file that a model folder may or may not have: `Ok(None)` when absent.
pub(crate) fn read_json_opt(path: &Path) -> Result<Option<Value>> {
    if !path.exists() {
        return Ok(None);
    }
    let text = std::fs::read_to_string(path).map_err(|source| TokenizerError::Io { path: path.to_owned(), source })?;
    serde_json::from_str(&text).map(Some).map_err(|source| TokenizerError::Json { path: path.to_owned(), source })
}

/// A special token entry of `tokenizer_config.json` (`bos_token`, `eos_token`, ...): written
/// either as a string or as an AddedToken object with `content`. Absent or null gives `None`.
pub(crate) fn special_token(config: &Value, key: &str, path: &Path) -> Result<Option<String>> {
    match config.get(key) {
        None | Some(Value::Null) => Ok(None),
        Some(Value::String(s)) => Ok(Some(s.clone())),
        Some(Value::Object(o)) => match o.get("content") {
            Some(Value::String(s)) => Ok(Some(s.clone())),
            _ => Err(TokenizerError::Invalid {
                path: path.to_owned(),
                what: format!("{key} is an object without a string \"content\""),
            }),
        },
        Some(other) => Err(TokenizerError::Invalid {
            path: path.to_owned(),
            what: format!("{key} must be a string or an object with \"content\", got {other}"),
        }),
    }
}

/// `eos_token_id` of a config object: an integer, a list of integers, or absent/null.
fn eos_token_ids(config: &Value, path: &Path) -> Result<Vec<u32>> {
    let invalid = |v: &Value| TokenizerError::Invalid {
        path: path.to_owned(),
        what: format!("eos_token_id must be a token id or a list of token ids, got {v}"),
    };
    let one = |v: &Value| v.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| invalid(v));
    match config.get("eos_token_id") {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(items)) => items.iter().map(one).collect(),
        Some(v) => Ok(vec![one(v)?]),
    }
}

/// The ids that end generation for the model in `dir`: the union, in this order and without
/// repeats, of `generation_config.json` `eos_token_id`, `config.json` `eos_token_id` (or its
/// `text_config`'s, for multimodal configs), and the id of `tokenizer_config.json`'s
/// `eos_token`. Missing files contribute nothing; an empty result means no stop id is declared.
pub fn eos_ids(dir: &Path, tokenizer: &Tokenizer) -> Result<Vec<u32>> {
    let mut ids = Vec::new();
    let gen_path = dir.join("generation_config.json");
    if let Some(gen_config) = read_json_opt(&gen_path)? {
        ids.extend(eos_token_ids(&gen_config, &gen_path)?);
    }
    let config_path = dir.join("config.json");
    if let Some(config) = read_json_opt(&config_path)? {
        let mut from_config = eos_token_ids(&config, &config_path)?;
        if from_config.is_empty()
            && let Some(text_config) = config.get("text_config")
        {
            from_config = eos_token_ids(text_config, &config_path)?;
        }
        ids.extend(from_config);
    }
    let tok_config_path = dir.join("tokenizer_config.json");
    if let Some(tok_config) = read_json_opt(&tok_config_path)?
        && let Some(eos) = special_token(&tok_config, "eos_token", &tok_config_path)?
    {
        let id = tokenizer.token_to_id(&eos).ok_or_else(|| TokenizerError::Invalid {
            path: tok_config_path.clone(),
            what: format!("eos_token {eos:?} is not a token of {}", tokenizer.path().display()),
        })?;
        ids.push(id);
    }
    let mut seen = std::collections::HashSet::new();
    ids.retain(|id| seen.insert(*id));
    Ok(ids)
}

/// The folder `cargo xtask model` fills, shared by the unit tests of the text modules.
#[cfg(test)]
pub(crate) mod test_model {
    use std::path::PathBuf;

    pub(crate) fn dir() -> PathBuf {
        let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../target/models/smollm2-135m-instruct-f16");
        assert!(
            dir.join("tokenizer.json").is_file() && dir.join("oracle.json").is_file(),
            "test model missing at {}: run `cargo xtask model` first",
            dir.display()
        );
        dir
    }

    pub(crate) fn oracle() -> serde_json::Value {
        let text = std::fs::read_to_string(dir().join("oracle.json")).expect("read oracle.json");
        serde_json::from_str(&text).expect("parse oracle.json")
    }

    /// The oracle trajectory of the given kind ("chat" or "raw").
    pub(crate) fn trajectory(kind: &str) -> serde_json::Value {
        let oracle = oracle();
        let all = oracle["trajectories"].as_array().expect("trajectories array");
        all.iter().find(|t| t["kind"] == kind).unwrap_or_else(|| panic!("no {kind} trajectory")).clone()
    }

    pub(crate) fn ids(v: &serde_json::Value) -> Vec<u32> {
        v.as_array().expect("id array").iter().map(|x| u32::try_from(x.as_u64().expect("int")).expect("u32")).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use test_model::{dir, ids, trajectory};

    #[test]
    fn raw_prompt_matches_mlx_lm() {
        let tok = Tokenizer::from_dir(&dir()).unwrap();
        let raw = trajectory("raw");
        let text = raw["prompt_text"].as_str().unwrap();
        assert_eq!(text, "The capital of France is");
        assert_eq!(tok.encode(text, true).unwrap(), ids(&raw["prompt_ids"]));
        assert_eq!(tok.encode(text, true).unwrap(), vec![504, 3575, 282, 4649, 314]);
    }

    #[test]
    fn special_tokens_in_text_are_single_tokens() {
        let tok = Tokenizer::from_dir(&dir()).unwrap();
        assert_eq!(tok.token_to_id("<|im_start|>"), Some(1));
        assert_eq!(tok.token_to_id("<|im_end|>"), Some(2));
        assert_eq!(tok.encode("<|im_start|>user\nhi<|im_end|>", false).unwrap()[0], 1);
        let ids = tok.encode("<|im_start|>user\nhi<|im_end|>", false).unwrap();
        assert_eq!(*ids.last().unwrap(), 2);
        // This tokenizer adds no BOS even when asked to add special tokens.
        assert_eq!(tok.encode("hi", true).unwrap(), tok.encode("hi", false).unwrap());
        assert_eq!(tok.vocab_size(), 49152);
    }

    #[test]
    fn decode_oracle_continuations() {
        let tok = Tokenizer::from_dir(&dir()).unwrap();
        for kind in ["chat", "raw"] {
            let t = trajectory(kind);
            let out = ids(&t["token_ids"]);
            // The oracle's text is mlx-lm's decode with special tokens kept.
            assert_eq!(tok.decode(&out, false).unwrap(), t["text"].as_str().unwrap(), "{kind}");
            assert!(tok.decode(&out, true).unwrap().contains("Paris"), "{kind}");
        }
        let chat = ids(&trajectory("chat")["token_ids"]);
        assert_eq!(tok.decode(&chat[..7], true).unwrap(), "The capital of France is Paris.");
        assert!(!tok.decode(&chat, true).unwrap().contains("<|im_end|>"));
    }

    #[test]
    fn round_trip_unicode() {
        let tok = Tokenizer::from_dir(&dir()).unwrap();
        let text = "café 日本 🦀 naïve\n\ttabs  and  spaces";
        assert_eq!(tok.decode(&tok.encode(text, false).unwrap(), false).unwrap(), text);
    }

    #[test]
    fn bad_ids_and_files_are_errors() {
        let tok = Tokenizer::from_dir(&dir()).unwrap();
        let err = tok.decode(&[504, 49152], false).unwrap_err().to_string();
        assert!(err.ends_with("cannot decode: token id 49152 is not in the vocabulary (size 49152)"), "{err}");

        let empty = tempfile::tempdir().unwrap();
        let err = Tokenizer::from_dir(empty.path()).unwrap_err().to_string();
        assert_eq!(err, format!("{}: not found", empty.path().join("tokenizer.json").display()));

        std::fs::write(empty.path().join("tokenizer.json"), "{\"version\": \"1.0\", \"model\": 7}").unwrap();
        let err = Tokenizer::from_dir(empty.path()).unwrap_err().to_string();
        assert!(
            err.starts_with(&format!("{}: not a usable tokenizer: ", empty.path().join("tokenizer.json").display())),
            "{err}"
        );
    }

    #[test]
    fn eos_ids_of_the_model() {
        let tok = Tokenizer::from_dir(&dir()).unwrap();
        assert_eq!(eos_ids(&dir(), &tok).unwrap(), vec![2]);
    }

    #[test]
    fn eos_ids_union_in_order() {
        let tok = Tokenizer::from_dir(&dir()).unwrap();
        let d = tempfile::tempdir().unwrap();
        std::fs::write(d.path().join("generation_config.json"), r#"{"eos_token_id": [7, 2]}"#).unwrap();
        std::fs::write(d.path().join("config.json"), r#"{"eos_token_id": 9}"#).unwrap();
        std::fs::write(
            d.path().join("tokenizer_config.json"),
            r#"{"eos_token": {"content": "<|endoftext|>", "__type": "AddedToken"}}"#,
        )
        .unwrap();
        assert_eq!(eos_ids(d.path(), &tok).unwrap(), vec![7, 2, 9, 0]);

        // Multimodal configs keep it in text_config; repeats are dropped.
        std::fs::write(d.path().join("config.json"), r#"{"text_config": {"eos_token_id": [0, 5]}}"#).unwrap();
        assert_eq!(eos_ids(d.path(), &tok).unwrap(), vec![7, 2, 0, 5]);

        std::fs::write(d.path().join("config.json"), r#"{"eos_token_id": "two"}"#).unwrap();
        let err = eos_ids(d.path(), &tok).unwrap_err().to_string();
        let path = d.path().join("config.json");
        assert_eq!(
            err,
            format!("{}: eos_token_id must be a token id or a list of token ids, got \"two\"", path.display())
        );

        std::fs::write(d.path().join("config.json"), "{").unwrap();
        let err = eos_ids(d.path(), &tok).unwrap_err().to_string();
        assert!(err.starts_with(&format!("{}: invalid JSON: ", path.display())), "{err}");

        std::fs::remove_file(d.path().join("config.json")).unwrap();
        std::fs::write(d.path().join("tokenizer_config.json"), r#"{"eos_token": "<nope>"}"#).unwrap();
        let err = eos_ids(d.path(), &tok).unwrap_err().to_string();
        assert!(err.contains("eos_token \"<nope>\" is not a token of"), "{err}");

        let none = tempfile::tempdir().unwrap();
        assert_eq!(eos_ids(none.path(), &tok).unwrap(), Vec::<u32>::new());
    }
}
