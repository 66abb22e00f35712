//! Constrained decoding: the tokens a grammar allows next, as a mask over the logits, so an
//! answer matches a JSON schema (structured output) or a tool-call format (a forced call).
//!
//! The grammar engine is llguidance (the one llama.cpp's and vLLM's servers can run): it
//! walks the grammar over bytes and a trie of the vocabulary's token bytes
//! ([`Tokenizer::token_bytes`]), so a token may span grammar pieces. [`Grammars`] is built
//! once per model (the trie); a [`Constraint`] per answer follows the tokens chosen. Where
//! the grammar is complete, only the end-of-sequence token is allowed.

use crate::tokenizer::Tokenizer;
use llguidance::api::TopLevelGrammar;
use llguidance::{Matcher, ParserFactory};
use serde_json::Value as Json;
use std::fmt;
use std::sync::Arc;
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenizerEnv};

/// Why a grammar could not be made or followed.
#[derive(Debug, thiserror::Error)]
pub enum ConstraintError {
    /// The schema or grammar a request gave (its fault).
    #[error("{0}")]
    Grammar(String),
    /// Following the grammar failed (a token it did not allow, or the engine's own error).
    #[error("constrained decoding failed: {0}")]
    Follow(String),
}

/// The vocabulary as llguidance sees it: the trie of token bytes, and the tokenizer for the
/// text it asks to tokenize.
struct Vocabulary {
    trie: TokTrie,
    tokenizer: Tokenizer,
}

impl TokenizerEnv for Vocabulary {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<u32> {
        // Grammar text is UTF-8; added tokens written in it are matched as tokens.
        self.tokenizer.encode(&String::from_utf8_lossy(s), false).unwrap_or_default()
    }
}

/// A model's grammar compiler: its vocabulary's trie, made once.
pub struct Grammars {
    factory: ParserFactory,
}

impl fmt::Debug for Grammars {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Grammars").finish_non_exhaustive()
    }
}

impl Grammars {
    /// The grammar compiler of `tokenizer`'s vocabulary; `eos` is the token that ends an answer
    /// (allowed where a grammar is complete).
    pub fn new(tokenizer: &Tokenizer, eos: u32) -> Result<Grammars, ConstraintError> {
        let words: Vec<Vec<u8>> = tokenizer
            .token_bytes()
            .into_iter()
            .map(
                |(bytes, special)| {
                    if special { [&[TokTrie::SPECIAL_TOKEN_MARKER][..], &bytes].concat() } else { bytes }
                },
            )
            .collect();
        let info = TokRxInfo::new(words.len() as u32, eos);
        let trie = TokTrie::from(&info, &words);
        let env: TokEnv = Arc::new(Vocabulary { trie, tokenizer: tokenizer.clone() });
        let mut factory = ParserFactory::new_simple(&env).map_err(|e| ConstraintError::Follow(e.to_string()))?;
        // Its diagnostics go into our errors, never to stderr.
        factory.quiet();
        Ok(Grammars { factory })
    }

    /// Answers that are JSON valid against `schema` (a JSON schema; `{"type": "object"}` for
    /// any object), written on one line with Python's separators (`", "`, `": "`), unless the
    /// schema's own `x-guidance` says otherwise: free whitespace would let a model run on in
    /// newlines until its token limit.
    pub fn json_schema(&self, schema: &Json) -> Result<Constraint, ConstraintError> {
        self.constraint(TopLevelGrammar::from_json_schema(compact(schema)))
    }

    /// Answers in a Lark grammar (llguidance's dialect: `%json {...}` for a schema inside it,
    /// `<[ID]>` for one token by id).
    pub fn lark(&self, grammar: &str) -> Result<Constraint, ConstraintError> {
        self.constraint(TopLevelGrammar::from_lark(grammar.to_owned()))
    }

    fn constraint(&self, grammar: TopLevelGrammar) -> Result<Constraint, ConstraintError> {
        let parser = self.factory.create_parser(grammar).map_err(|e| ConstraintError::Grammar(one_line(&e)))?;
        let matcher = Matcher::new(Ok(parser));
        if let Some(e) = matcher.get_error() {
            return Err(ConstraintError::Grammar(e.replace('\n', " ")));
        }
        Ok(Constraint { matcher })
    }
}

/// `schema` with llguidance's JSON layout options set to one line with Python's separators,
/// where it sets none.
pub fn compact(schema: &Json) -> Json {
    let mut schema = schema.clone();
    if let Some(fields) = schema.as_object_mut() {
        fields.entry("x-guidance").or_insert_with(
            || serde_json::json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "}),
        );
    }
    schema
}

/// The grammar allows no token of the vocabulary next.
fn no_token() -> ConstraintError {
    ConstraintError::Follow(
        "no token of this model's vocabulary can come next under the grammar (the model cannot write what the format needs)"
            .into(),
    )
}

fn one_line(e: &impl fmt::Display) -> String {
    e.to_string().replace('\n', " ")
}

/// One answer's grammar state.
pub struct Constraint {
    matcher: Matcher,
}

impl Clone for Constraint {
    /// An independent copy (its own parser and lexer caches), for another answer.
    fn clone(&self) -> Constraint {
        Constraint { matcher: self.matcher.deep_clone() }
    }
}

impl fmt::Debug for Constraint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Constraint").field("stopped", &self.matcher.is_stopped()).finish()
    }
}

impl Constraint {
    /// Sets every logit the grammar does not allow next to -inf (only the end-of-sequence
    /// token once the grammar is complete); ids past the vocabulary are left as they are
    /// (the engine's vocabulary limit masks them).
    pub fn mask(&mut self, logits: &mut [f32]) -> Result<(), ConstraintError> {
        let allowed = match self.matcher.compute_mask_or_eos() {
            Ok(allowed) => allowed,
            // llguidance stops with `NoExtensionBias` where no token extends the text (the
            // matcher is then in its error state, so the reason is only in the message).
            Err(e) if e.to_string().starts_with("NoExtensionBias") => return Err(no_token()),
            Err(e) => return Err(ConstraintError::Follow(one_line(&e))),
        };
        let n = allowed.len().min(logits.len());
        let mut any = false;
        for (id, logit) in logits[..n].iter_mut().enumerate() {
            if allowed.is_allowed(id as u32) {
                any = true;
            } else {
                *logit = f32::NEG_INFINITY;
            }
        }
        if !any {
            return Err(no_token());
        }
        Ok(())
    }

    /// Moves on past `token`, which the mask allowed.
    pub fn accept(&mut self, token: u32) -> Result<(), ConstraintError> {
        if self.matcher.is_stopped() {
            // The end-of-sequence token after a complete grammar.
            return Ok(());
        }
        self.matcher.consume_token(token).map_err(|e| ConstraintError::Follow(one_line(&e)))
    }

    /// Whether the text so far completes the grammar.
    pub fn is_complete(&mut self) -> bool {
        self.matcher.is_stopped() || self.matcher.is_accepting().unwrap_or(false)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::test_model::dir;
    use serde_json::json;

    /// Greedy decoding of a fake model that prefers `wanted`'s tokens but whose mask comes
    /// from the grammar: each step's best allowed token, from logits that rank the whole
    /// vocabulary by id (so the grammar alone decides what is valid).
    fn run(tok: &Tokenizer, c: &mut Constraint, eos: u32, steps: usize) -> String {
        let vocab = tok.vocab_size();
        let mut out = Vec::new();
        for _ in 0..steps {
            // Prefer short tokens that close structures, so the walk ends.
            let mut logits: Vec<f32> = (0..vocab).map(|i| -(i as f32)).collect();
            c.mask(&mut logits).unwrap();
            let best = (0..vocab).max_by(|&a, &b| logits[a].total_cmp(&logits[b])).unwrap() as u32;
            assert!(logits[best as usize].is_finite(), "nothing allowed after {out:?}");
            c.accept(best).unwrap();
            if best == eos {
                break;
            }
            out.push(best);
        }
        tok.decode(&out, false).unwrap()
    }

    /// A grammar that needs bytes no token of the vocabulary writes (a newline, for a
    /// word-level vocabulary split on whitespace) is one clear error, not a pick the grammar
    /// then refuses.
    #[test]
    fn a_grammar_the_vocabulary_cannot_write_is_a_clear_error() {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../../tests/scripted/hermes/tokenizer.json");
        let tok = Tokenizer::from_file(&path).unwrap();
        let grammars = Grammars::new(&tok, 0).unwrap();
        let mut c = grammars.lark("start: \"\\n\"").unwrap();
        let mut logits = vec![0.0; tok.vocab_size()];
        let err = c.mask(&mut logits).unwrap_err();
        assert_eq!(
            err.to_string(),
            "constrained decoding failed: no token of this model's vocabulary can come next under the grammar (the model cannot write what the format needs)"
        );
    }

    #[test]
    fn a_schema_allows_only_valid_json() {
        let tok = Tokenizer::from_dir(&dir()).unwrap();
        let eos = tok.token_to_id("<|im_end|>").unwrap();
        let grammars = Grammars::new(&tok, eos).unwrap();
        let schema = json!({"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}},
                            "required": ["answer"], "additionalProperties": false});
        let mut c = grammars.json_schema(&schema).unwrap();
        let text = run(&tok, &mut c, eos, 64);
        let value: Json = serde_json::from_str(&text).unwrap_or_else(|e| panic!("{text:?}: {e}"));
        assert!(value == json!({"answer": "yes"}) || value == json!({"answer": "no"}), "{text}");
        assert!(c.is_complete());
        // A token the mask forbids is refused.
        let mut c = grammars.json_schema(&schema).unwrap();
        let x = tok.encode("x", false).unwrap()[0];
        assert!(matches!(c.accept(x), Err(ConstraintError::Follow(_))));
    }

    /// A forced tool call: the format's markers around one call of a tool given, its
    /// arguments valid against the tool's schema (`<|im_start|>` and `<|im_end|>` stand in
    /// for `<tool_call>` and `</tool_call>`, which SmolLM2's vocabulary lacks).
    #[test]
    fn a_forced_call_is_a_whole_call_of_a_tool_given() {
        use crate::tools::{ToolFormat, ToolMarkers};
        let tok = Tokenizer::from_dir(&dir()).unwrap();
        let eos = tok.token_to_id("<|endoftext|>").unwrap();
        let grammars = Grammars::new(&tok, eos).unwrap();
        let (start, end) = (tok.token_to_id("<|im_start|>").unwrap(), tok.token_to_id("<|im_end|>").unwrap());
        let tools = [
            json!({"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
                "properties": {"days": {"type": "integer", "minimum": 1, "maximum": 3}}, "required": ["days"],
                "additionalProperties": false}}}),
            json!({"type": "function", "function": {"name": "get_time"}}),
        ];
        let markers = Some(ToolMarkers { start, end: Some(end) });
        // Hermes JSON, and Qwen3-Coder's `<function=...>` with a `<parameter=...>` per argument.
        for format in [ToolFormat::Json, ToolFormat::Qwen3Coder] {
            for name in ["get_weather", "get_time"] {
                let grammar = format.forced_call(markers, None, &tools, Some(name)).unwrap();
                let mut c = grammars.lark(&grammar).unwrap_or_else(|e| panic!("{grammar}: {e}"));
                let text = run(&tok, &mut c, eos, 64);
                let body = text.strip_prefix("<|im_start|>").and_then(|t| t.strip_suffix("<|im_end|>"));
                let calls = format.parse(body.unwrap_or_else(|| panic!("{text:?}")), &tools).unwrap();
                assert_eq!(calls[0].name, name, "{text}");
                if name == "get_weather" {
                    assert!((1..=3).contains(&calls[0].arguments["days"].as_i64().unwrap()), "{text}");
                }
            }
        }
        assert_eq!(ToolFormat::Json.forced_call(markers, None, &tools, Some("nope")), None);
        // Mistral's: a list of calls after its marker (this walk would list calls forever).
        let mistral =
            ToolFormat::Mistral.forced_call(Some(ToolMarkers { start, end: None }), None, &tools, None).unwrap();
        let mut c = grammars.lark(&mistral).unwrap();
        let text = run(&tok, &mut c, eos, 24);
        assert!(text.starts_with("<|im_start|>[{\"name\": \"get_time\", \"arguments\": {}}, {"), "{text}");
    }

    #[test]
    fn bad_schemas_and_grammars_are_the_requests_fault() {
        let tok = Tokenizer::from_dir(&dir()).unwrap();
        let grammars = Grammars::new(&tok, 2).unwrap();
        let err = grammars.json_schema(&json!({"type": "nonsense"})).unwrap_err();
        assert!(matches!(&err, ConstraintError::Grammar(m) if !m.contains('\n')), "{err}");
        assert!(matches!(grammars.lark("start: ("), Err(ConstraintError::Grammar(_))));
    }

    #[test]
    fn byte_level_tokens_are_their_bytes() {
        let tok = Tokenizer::from_dir(&dir()).unwrap();
        let bytes = tok.token_bytes();
        assert_eq!(bytes.len(), tok.vocab_size());
        let space_the = tok.encode(" the", false).unwrap();
        assert_eq!(space_the.len(), 1);
        assert_eq!(bytes[space_the[0] as usize], (b" the".to_vec(), false));
        let im_end = tok.token_to_id("<|im_end|>").unwrap() as usize;
        assert_eq!(bytes[im_end], (b"<|im_end|>".to_vec(), true));
        let newline = tok.encode("\n", false).unwrap()[0] as usize;
        assert_eq!(bytes[newline].0, b"\n");
    }
}
