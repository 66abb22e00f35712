//! The OpenAI request bodies this server takes, and their checks: every field is parsed
//! and validated (with a 400 naming it) before anything reaches the engine.

use crate::error::ApiError;
use serde::Deserialize;
use text::sampler::SamplingParams;

/// `prompt` of /v1/completions: a string, or token ids; a list of one string is accepted
/// as that string (several prompts per request are refused).
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Prompt {
    Text(String),
    Texts(Vec<String>),
    Ids(Vec<u32>),
    IdLists(Vec<Vec<u32>>),
}

/// `stop`: one string or a list.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Stop {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
}

/// The fields both endpoints share.
#[derive(Debug, Deserialize)]
pub struct Common {
    pub model: Option<String>,
    pub max_tokens: Option<usize>,
    /// The chat endpoint's newer name for `max_tokens`.
    pub max_completion_tokens: Option<usize>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// Extension (llama.cpp, vLLM and mlx_lm.server take it too).
    pub top_k: Option<usize>,
    pub seed: Option<u64>,
    pub stop: Option<Stop>,
    /// Extension (llama.cpp's server and vLLM take it): generate past the model's
    /// end-of-sequence tokens, up to `max_tokens` (stop strings still stop), so throughput
    /// benchmarks compare the same number of tokens on every server.
    #[serde(default)]
    pub ignore_eos: bool,
    pub n: Option<usize>,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
}

#[derive(Debug, Deserialize)]
pub struct CompletionBody {
    pub prompt: Prompt,
    #[serde(flatten)]
    pub common: Common,
}

/// A chat message's `content`: a string, or a list of parts of which only text parts are
/// understood.
#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum Content {
    Text(String),
    Parts(Vec<Part>),
}

#[derive(Debug, Deserialize)]
pub struct Part {
    #[serde(rename = "type")]
    pub kind: String,
    pub text: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct ChatMessage {
    pub role: String,
    /// `null` for an assistant turn that only called tools; taken as empty.
    pub content: Option<Content>,
}

#[derive(Debug, Deserialize)]
pub struct ChatBody {
    pub messages: Vec<ChatMessage>,
    #[serde(flatten)]
    pub common: Common,
}

/// OpenAI's default temperature.
const DEFAULT_TEMPERATURE: f32 = 1.0;
/// Most stop strings per request.
const MAX_STOPS: usize = 16;

/// Parses a request body, with a 400 that says what is wrong.
pub fn parse<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))
}

impl Prompt {
    /// The prompt's text or ids.
    pub fn single(self) -> Result<Result<String, Vec<u32>>, ApiError> {
        match self {
            Prompt::Text(text) => Ok(Ok(text)),
            Prompt::Ids(ids) => Ok(Err(ids)),
            Prompt::Texts(mut texts) if texts.len() == 1 => Ok(Ok(texts.remove(0))),
            Prompt::IdLists(mut lists) if lists.len() == 1 => Ok(Err(lists.remove(0))),
            Prompt::Texts(texts) => Err(several(texts.len())),
            Prompt::IdLists(lists) => Err(several(lists.len())),
        }
    }
}

fn several(n: usize) -> ApiError {
    ApiError::field("prompt", format!("{n} prompts in one request: send one prompt per request"))
}

impl ChatMessage {
    /// The message's text: a string, or its text parts joined.
    pub fn text(&self) -> Result<String, ApiError> {
        match &self.content {
            None => Ok(String::new()),
            Some(Content::Text(text)) => Ok(text.clone()),
            Some(Content::Parts(parts)) => parts
                .iter()
                .map(|p| match (p.kind.as_str(), &p.text) {
                    ("text", Some(text)) => Ok(text.as_str()),
                    (kind, _) => Err(ApiError::field(
                        "messages",
                        format!("content parts of type `{kind}` are not supported (text only)"),
                    )),
                })
                .collect::<Result<Vec<&str>, ApiError>>()
                .map(|texts| texts.concat()),
        }
    }
}

impl Common {
    /// Sampling settings (temperature 0: greedy), checked with messages naming the fields.
    pub fn sampling(&self, default_seed: u64) -> Result<SamplingParams, ApiError> {
        let temperature = self.temperature.unwrap_or(DEFAULT_TEMPERATURE);
        if !temperature.is_finite() || temperature < 0.0 {
            return Err(ApiError::field(
                "temperature",
                format!("temperature must be a finite number >= 0, got {temperature}"),
            ));
        }
        if let Some(p) = self.top_p
            && !(p > 0.0 && p <= 1.0)
        {
            return Err(ApiError::field("top_p", format!("top_p must be greater than 0 and at most 1, got {p}")));
        }
        if self.top_k == Some(0) {
            return Err(ApiError::field("top_k", "top_k must be at least 1, got 0"));
        }
        Ok(SamplingParams {
            temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            seed: self.seed.unwrap_or(default_seed),
        })
    }

    /// `n` must be 1 (one choice per request).
    pub fn check_n(&self) -> Result<(), ApiError> {
        match self.n {
            None | Some(1) => Ok(()),
            Some(n) => Err(ApiError::field("n", format!("n must be 1, got {n}: send one request per choice"))),
        }
    }

    pub fn stops(&self) -> Result<Vec<String>, ApiError> {
        let stops = match &self.stop {
            None => Vec::new(),
            Some(Stop::One(s)) => vec![s.clone()],
            Some(Stop::Many(v)) => v.clone(),
        };
        if stops.len() > MAX_STOPS {
            return Err(ApiError::field("stop", format!("at most {MAX_STOPS} stop strings, got {}", stops.len())));
        }
        Ok(stops)
    }

    /// Tokens to generate: the request's (`max_tokens`, else `max_completion_tokens`), else
    /// what is left of the context; the prompt and them must fit the context.
    pub fn max_tokens(&self, prompt: usize, context: usize) -> Result<usize, ApiError> {
        match self.max_tokens.or(self.max_completion_tokens) {
            Some(0) => Err(ApiError::field("max_tokens", "max_tokens must be at least 1")),
            Some(n) if prompt + n > context => Err(ApiError::field(
                "max_tokens",
                format!(
                    "the prompt ({prompt} tokens) plus max_tokens ({n}) exceed the context limit ({context} tokens)"
                ),
            )),
            Some(n) => Ok(n),
            None if prompt >= context => Err(ApiError::field(
                "messages",
                format!("the prompt ({prompt} tokens) leaves no room in the context limit ({context} tokens)"),
            )),
            None => Ok(context - prompt),
        }
    }

    pub fn include_usage(&self) -> bool {
        self.stream_options.as_ref().is_some_and(|o| o.include_usage)
    }
}
