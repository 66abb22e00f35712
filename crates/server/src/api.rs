//! The OpenAI request bodies this server takes, and their checks: every field is parsed
//! and validated (with a 400 naming it) before anything reaches the engine. Which fields a
//! body may have is an explicit list ([`Use`]): those read, those OpenAI defines without
//! effect on the output (accepted, not read), and those not implemented yet (refused unless
//! their value asks for nothing); any other field is refused.

use crate::error::ApiError;
use serde::Deserialize;
use serde_json::{Map, Value};
use std::collections::BTreeMap;
use text::chat::Arg;
use text::sampler::{MAX_LOGIT_BIAS, MAX_PENALTY, MAX_TOP_LOGPROBS, SamplingParams};

/// What the server does with a request field.
#[derive(Debug, Clone, Copy)]
enum Use {
    /// Read and honoured.
    Read,
    /// Defined by the OpenAI API without effect on the answer (bookkeeping, caching and
    /// latency hints): accepted and not read.
    NoEffect,
    /// Not implemented yet: refused with a 400 naming it, unless its value asks for nothing
    /// (`accepts`; `null` always does), which `only` describes.
    NotYet { accepts: fn(&Value) -> bool, only: &'static str },
}

const fn not_yet() -> Use {
    Use::NotYet { accepts: |_| false, only: "" }
}

/// The fields of both endpoints' bodies.
const COMMON_FIELDS: &[(&str, Use)] = &[
    ("model", Use::Read),
    ("max_tokens", Use::Read),
    ("max_completion_tokens", Use::Read),
    ("temperature", Use::Read),
    ("top_p", Use::Read),
    ("top_k", Use::Read),
    ("min_p", Use::Read),
    ("presence_penalty", Use::Read),
    ("frequency_penalty", Use::Read),
    ("repetition_penalty", Use::Read),
    ("logit_bias", Use::Read),
    ("logprobs", Use::Read),
    ("seed", Use::Read),
    ("stop", Use::Read),
    ("ignore_eos", Use::Read),
    ("n", Use::Read),
    ("stream", Use::Read),
    ("stream_options", Use::Read),
    ("user", Use::NoEffect),
    ("metadata", Use::NoEffect),
    ("store", Use::NoEffect),
    ("service_tier", Use::NoEffect),
    ("safety_identifier", Use::NoEffect),
    ("prompt_cache_key", Use::NoEffect),
    ("prompt_cache_retention", Use::NoEffect),
];

/// The fields only /v1/chat/completions has.
const CHAT_FIELDS: &[(&str, Use)] = &[
    ("messages", Use::Read),
    ("top_logprobs", Use::Read),
    ("prediction", Use::NoEffect),
    ("response_format", Use::Read),
    ("tools", Use::Read),
    ("tool_choice", Use::Read),
    // Every call the model writes is given; asking for at most one is not built yet.
    ("parallel_tool_calls", Use::NotYet { accepts: |v| *v == Value::Bool(true), only: " (only true)" }),
    ("functions", Use::NotYet { accepts: |v| v.as_array().is_some_and(Vec::is_empty), only: " (only an empty list)" }),
    ("function_call", Use::NotYet { accepts: |v| v == "none", only: " (only \"none\")" }),
    ("modalities", Use::NotYet { accepts: |v| *v == serde_json::json!(["text"]), only: " (only [\"text\"])" }),
    ("audio", not_yet()),
    ("reasoning_effort", Use::Read),
    ("verbosity", not_yet()),
    ("web_search_options", not_yet()),
];

/// The fields only /v1/completions has.
const COMPLETION_FIELDS: &[(&str, Use)] = &[
    ("prompt", Use::Read),
    ("echo", Use::NotYet { accepts: |v| *v == Value::Bool(false), only: " (only false)" }),
    ("suffix", Use::NotYet { accepts: |v| v == "", only: " (only \"\")" }),
    ("best_of", Use::NotYet { accepts: |v| v.as_u64() == Some(1), only: " (only 1)" }),
];

/// The fields of a chat message.
const MESSAGE_FIELDS: &[(&str, Use)] = &[
    ("role", Use::Read),
    ("content", Use::Read),
    ("name", Use::Read),
    ("tool_calls", Use::Read),
    ("tool_call_id", Use::Read),
    ("function_call", not_yet()),
    ("audio", not_yet()),
    ("refusal", not_yet()),
];

/// The fields of a text content part.
const TEXT_PART_FIELDS: &[(&str, Use)] = &[("type", Use::Read), ("text", Use::Read)];

/// The fields of `stream_options`.
const STREAM_OPTION_FIELDS: &[(&str, Use)] = &[("include_usage", Use::Read), ("include_obfuscation", Use::NoEffect)];

/// The fields of `/tokenize` (llama.cpp's shape).
const TOKENIZE_FIELDS: &[(&str, Use)] = &[("content", Use::Read), ("add_special", Use::Read)];

/// The fields of `/detokenize` (llama.cpp's shape).
const DETOKENIZE_FIELDS: &[(&str, Use)] = &[("tokens", Use::Read)];

/// Refuses a field of `body` (an object at `at`, such as `messages[0].`) that `fields` does
/// not list, and one listed as not implemented whose value asks for something.
fn check_fields(body: &Map<String, Value>, fields: &[&[(&str, Use)]], at: &str) -> Result<(), ApiError> {
    for (key, value) in body {
        let param = format!("{at}{key}");
        match fields.iter().flat_map(|f| f.iter()).find(|(name, _)| name == key) {
            None => return Err(ApiError::field(param.clone(), format!("unknown field `{param}`"))),
            Some((_, Use::NotYet { accepts, only })) if !value.is_null() && !accepts(value) => {
                return Err(ApiError::field(param.clone(), format!("`{param}` is not supported yet{only}")));
            }
            Some(_) => {}
        }
    }
    Ok(())
}

/// The body as a JSON object, with serde's message when it is not one.
fn object(bytes: &[u8]) -> Result<Map<String, Value>, ApiError> {
    serde_json::from_slice(bytes).map_err(|e| ApiError::bad_request(format!("invalid request body: {e}")))
}

/// A /v1/chat/completions body: its fields, its messages' and their content parts' checked
/// against the lists, then parsed.
pub fn parse_chat(bytes: &[u8]) -> Result<ChatBody, ApiError> {
    let body = object(bytes)?;
    check_fields(&body, &[COMMON_FIELDS, CHAT_FIELDS], "")?;
    check_stream_options(&body)?;
    if let Some(Value::Array(messages)) = body.get("messages") {
        for (i, message) in messages.iter().enumerate() {
            let Value::Object(message) = message else { continue };
            let at = format!("messages[{i}].");
            check_fields(message, &[MESSAGE_FIELDS], &at)?;
            if let Some(Value::Array(parts)) = message.get("content") {
                for (j, part) in parts.iter().enumerate() {
                    let Value::Object(part) = part else { continue };
                    match part.get("type").and_then(Value::as_str) {
                        Some("text") => {
                            check_fields(part, &[TEXT_PART_FIELDS], &format!("{at}content[{j}]."))?;
                            if !part.get("text").is_some_and(Value::is_string) {
                                return Err(ApiError::field(
                                    format!("{at}content"),
                                    "a text content part needs a string `text`",
                                ));
                            }
                        }
                        kind => {
                            return Err(ApiError::field(
                                format!("{at}content"),
                                format!(
                                    "content parts of type `{}` are not supported (text only)",
                                    kind.unwrap_or("(none)")
                                ),
                            ));
                        }
                    }
                }
            }
        }
    }
    parse(bytes)
}

/// A /v1/completions body: its fields checked against the lists, then parsed.
pub fn parse_completion(bytes: &[u8]) -> Result<CompletionBody, ApiError> {
    let body = object(bytes)?;
    check_fields(&body, &[COMMON_FIELDS, COMPLETION_FIELDS], "")?;
    check_stream_options(&body)?;
    parse(bytes)
}

fn check_stream_options(body: &Map<String, Value>) -> Result<(), ApiError> {
    match body.get("stream_options") {
        Some(Value::Object(options)) => check_fields(options, &[STREAM_OPTION_FIELDS], "stream_options."),
        _ => Ok(()),
    }
}

/// `POST /tokenize`: llama.cpp's shape.
#[derive(Debug, Deserialize)]
pub struct TokenizeBody {
    pub content: String,
    /// Add the tokenizer's special tokens (such as a beginning-of-sequence token), as a
    /// prompt is encoded; default false, as llama.cpp's.
    #[serde(default)]
    pub add_special: bool,
}

/// `POST /detokenize`: llama.cpp's shape.
#[derive(Debug, Deserialize)]
pub struct DetokenizeBody {
    pub tokens: Vec<u32>,
}

pub fn parse_tokenize(bytes: &[u8]) -> Result<TokenizeBody, ApiError> {
    check_fields(&object(bytes)?, &[TOKENIZE_FIELDS], "")?;
    parse(bytes)
}

pub fn parse_detokenize(bytes: &[u8]) -> Result<DetokenizeBody, ApiError> {
    check_fields(&object(bytes)?, &[DETOKENIZE_FIELDS], "")?;
    parse(bytes)
}

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
    /// Extension (llama.cpp and vLLM take it too).
    pub min_p: Option<f32>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    /// Extension (llama.cpp and vLLM take it too).
    pub repetition_penalty: Option<f32>,
    /// Token id (as a string key, as JSON objects have) to a bias from -100 to 100.
    pub logit_bias: Option<BTreeMap<String, f32>>,
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
    /// How many most likely tokens to give beside each chosen one's logprob.
    pub logprobs: Option<usize>,
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
    /// An assistant turn's calls: `{id, type: "function", function: {name, arguments}}`, the
    /// arguments a string of JSON (as OpenAI gives them) or an object.
    pub tool_calls: Option<Vec<Arg>>,
    /// A `tool` turn's answer to this call.
    pub tool_call_id: Option<String>,
    pub name: Option<String>,
}

#[derive(Debug, Deserialize)]
pub struct ChatBody {
    pub messages: Vec<ChatMessage>,
    pub logprobs: Option<bool>,
    pub top_logprobs: Option<usize>,
    /// For a chat template that reads it (gpt-oss's): `low`, `medium` or `high`.
    pub reasoning_effort: Option<String>,
    /// Functions the model may call: `{type: "function", function: {name, description,
    /// parameters, strict}}`, handed to the chat template in the order written.
    pub tools: Option<Vec<Arg>>,
    /// `none`, `auto`, `required` or `{type: "function", function: {name}}`.
    pub tool_choice: Option<Value>,
    /// `{type: "text"}`, `{type: "json_object"}` or `{type: "json_schema", json_schema:
    /// {name, schema, strict, description}}`.
    pub response_format: Option<Value>,
    #[serde(flatten)]
    pub common: Common,
}

/// What a chat request does with its tools.
#[derive(Debug, Clone, PartialEq)]
pub enum ToolUse {
    /// No tools offered (or `tool_choice: "none"`): the template sees none and the answer is
    /// text.
    None,
    /// The tools go to the template, and the calls the model writes are read apart.
    Auto {
        /// The definitions as written (key order kept), for the template.
        template: Arg,
        /// The same, to read the calls by (Qwen3-Coder's argument types).
        definitions: Vec<Value>,
    },
    /// As `Auto`, and the answer must be a call (`required`), of the function named where
    /// one is: decoding is constrained to the model's call format.
    Forced { template: Arg, definitions: Vec<Value>, name: Option<String> },
}

/// OpenAI's default temperature.
const DEFAULT_TEMPERATURE: f32 = 1.0;
/// Most answers per request (`n`): each takes a slot of its own.
pub const MAX_N: usize = 16;
/// Most stop strings per request.
const MAX_STOPS: usize = 16;

/// Parses a request body, with a 400 that says what is wrong.
fn parse<T: for<'de> Deserialize<'de>>(bytes: &[u8]) -> Result<T, ApiError> {
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
    /// The message as the chat template sees it (message `i` of the request): its role
    /// (`developer`, OpenAI's newer name for `system`, as `system`), its text, and its tool
    /// calls (their arguments as JSON objects, as transformers' templates print them) or the
    /// call it answers.
    pub fn message(&self, i: usize) -> Result<text::chat::Message, ApiError> {
        let at = |field: &str| format!("messages[{i}].{field}");
        let role = match self.role.as_str() {
            "system" | "developer" => "system",
            "user" => "user",
            "assistant" => "assistant",
            "tool" => "tool",
            "function" => {
                return Err(ApiError::field(
                    at("role"),
                    "messages of role `function` (deprecated by OpenAI) are not supported: use `tool`",
                ));
            }
            other => {
                return Err(ApiError::field(
                    at("role"),
                    format!("unknown role `{other}` (system, developer, user, assistant or tool)"),
                ));
            }
        };
        if self.tool_calls.is_some() && role != "assistant" {
            return Err(ApiError::field(at("tool_calls"), "only assistant messages have tool_calls"));
        }
        if role == "tool" && self.tool_call_id.is_none() {
            return Err(ApiError::field(at("tool_call_id"), "a tool message needs the tool_call_id it answers"));
        }
        let tool_calls = match &self.tool_calls {
            None => None,
            Some(calls) => Some(
                calls
                    .iter()
                    .enumerate()
                    .map(|(j, call)| tool_call(call, &at(&format!("tool_calls[{j}]"))))
                    .collect::<Result<Vec<_>, _>>()?,
            ),
        };
        Ok(text::chat::Message {
            tool_calls,
            tool_call_id: self.tool_call_id.clone(),
            name: self.name.clone(),
            ..text::chat::Message::new(role, self.text())
        })
    }

    /// The message's text: a string, or its text parts joined (other parts were refused by
    /// [`parse_chat`]).
    fn text(&self) -> String {
        match &self.content {
            None => String::new(),
            Some(Content::Text(text)) => text.clone(),
            Some(Content::Parts(parts)) => parts.iter().filter_map(|p| p.text.as_deref()).collect(),
        }
    }
}

/// An assistant message's tool call (at `at`) as templates take it: `{id, type, function:
/// {name, arguments}}`, its arguments a JSON object in the order written.
fn tool_call(call: &Arg, at: &str) -> Result<Arg, ApiError> {
    let json = call.to_json();
    let Some(fields) = json.as_object() else {
        return Err(ApiError::field(at, format!("`{at}` must be an object")));
    };
    if let Some(key) = fields.keys().find(|k| !["id", "type", "function"].contains(&k.as_str())) {
        return Err(ApiError::field(format!("{at}.{key}"), format!("unknown field `{at}.{key}`")));
    }
    if fields.get("type").is_some_and(|t| t != "function") {
        return Err(ApiError::field(format!("{at}.type"), "tool calls are of type `function`"));
    }
    let function = fields.get("function").and_then(Value::as_object);
    let name = function.and_then(|f| f.get("name")).and_then(Value::as_str).filter(|n| !n.is_empty());
    let Some(name) = name else {
        return Err(ApiError::field(format!("{at}.function.name"), "a tool call needs a function name"));
    };
    let arguments = match function.and_then(|f| f.get("arguments")) {
        None | Some(Value::Null) => Arg::parse("{}"),
        Some(Value::String(text)) => Arg::parse(text),
        Some(Value::Object(_)) => Ok(call_arguments(call)),
        Some(_) => Arg::parse("null"),
    };
    let arguments = arguments.ok().filter(|a| a.to_json().is_object()).ok_or_else(|| {
        ApiError::field(format!("{at}.function.arguments"), "a tool call's arguments must be a JSON object")
    })?;
    let mut parts = vec![];
    if let Some(id) = fields.get("id").and_then(Value::as_str) {
        parts.push(("id", Arg::str(id)));
    }
    parts.push(("type", Arg::str("function")));
    parts.push(("function", Arg::object([("name", Arg::str(name)), ("arguments", arguments)])));
    Ok(Arg::object(parts))
}

/// `function.arguments` of a call given as an object, its key order kept.
fn call_arguments(call: &Arg) -> Arg {
    call.get("function").and_then(|f| f.get("arguments")).unwrap_or_else(|| Arg::str(""))
}

impl ChatBody {
    /// The tools offered and what to do with them, each definition checked.
    pub fn tool_use(&self) -> Result<ToolUse, ApiError> {
        let tools = self.tools.as_deref().unwrap_or_default();
        let mut names = Vec::new();
        let mut definitions = Vec::new();
        for (i, tool) in tools.iter().enumerate() {
            let at = format!("tools[{i}]");
            let json = tool.to_json();
            let function = match json.as_object() {
                Some(t) if t.get("type").and_then(Value::as_str) == Some("function") => {
                    if let Some(key) = t.keys().find(|k| *k != "type" && *k != "function") {
                        return Err(ApiError::field(format!("{at}.{key}"), format!("unknown field `{at}.{key}`")));
                    }
                    t.get("function").and_then(Value::as_object)
                }
                _ => return Err(ApiError::field(format!("{at}.type"), "tools must be of type `function`")),
            };
            let Some(function) = function else {
                return Err(ApiError::field(format!("{at}.function"), "a tool needs a `function` object"));
            };
            if let Some(key) =
                function.keys().find(|k| !["name", "description", "parameters", "strict"].contains(&k.as_str()))
            {
                let param = format!("{at}.function.{key}");
                return Err(ApiError::field(param.clone(), format!("unknown field `{param}`")));
            }
            let name = function.get("name").and_then(Value::as_str).unwrap_or_default();
            if name.is_empty() || !name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-') {
                return Err(ApiError::field(
                    format!("{at}.function.name"),
                    "a tool needs a name of letters, digits, `_` and `-`",
                ));
            }
            if function.get("parameters").is_some_and(|p| !p.is_object()) {
                return Err(ApiError::field(
                    format!("{at}.function.parameters"),
                    "a tool's parameters must be a JSON schema object",
                ));
            }
            if names.iter().any(|n| n == name) {
                return Err(ApiError::field(format!("{at}.function.name"), format!("two tools are named `{name}`")));
            }
            names.push(name.to_owned());
            definitions.push(json.clone());
        }
        let mut named = None;
        let choice = match &self.tool_choice {
            None | Some(Value::Null) => None,
            Some(Value::String(s)) => Some(s.as_str()),
            Some(Value::Object(o)) if o.get("type").and_then(Value::as_str) == Some("function") => {
                let name = o.get("function").and_then(|f| f.get("name")).and_then(Value::as_str);
                match name {
                    Some(name) if names.iter().any(|n| n == name) => {
                        named = Some(name.to_owned());
                        Some("named")
                    }
                    Some(name) => {
                        return Err(ApiError::field(
                            "tool_choice",
                            format!("tool_choice names `{name}`, not a tool given"),
                        ));
                    }
                    None => return Err(ApiError::field("tool_choice", "tool_choice.function needs a name")),
                }
            }
            Some(_) => {
                return Err(ApiError::field(
                    "tool_choice",
                    "tool_choice must be none, auto, required or {\"type\": \"function\", \"function\": {\"name\"}}",
                ));
            }
        };
        match choice {
            Some("none") => Ok(ToolUse::None),
            None | Some("auto") if tools.is_empty() => Ok(ToolUse::None),
            None | Some("auto") => Ok(ToolUse::Auto { template: Arg::list(tools.iter().cloned()), definitions }),
            Some("required" | "named") if tools.is_empty() => {
                Err(ApiError::field("tool_choice", "tool_choice asks for a tool call, but no tools are given"))
            }
            Some("required" | "named") => {
                Ok(ToolUse::Forced { template: Arg::list(tools.iter().cloned()), definitions, name: named })
            }
            Some(other) => Err(ApiError::field(
                "tool_choice",
                format!("tool_choice must be none, auto, required or a function, got `{other}`"),
            )),
        }
    }

    /// How many alternatives per token `logprobs: true` asks for (`top_logprobs`, default
    /// 0); `None` without it.
    pub fn logprobs(&self) -> Result<Option<usize>, ApiError> {
        match (self.logprobs.unwrap_or(false), self.top_logprobs) {
            (_, Some(n)) if n > MAX_TOP_LOGPROBS => Err(ApiError::field(
                "top_logprobs",
                format!("top_logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {n}"),
            )),
            (false, Some(n)) if n > 0 => Err(ApiError::field("top_logprobs", "top_logprobs needs logprobs: true")),
            (true, n) => Ok(Some(n.unwrap_or(0))),
            (false, _) => Ok(None),
        }
    }
}

impl ChatBody {
    /// The JSON schema the answer must be valid against (`json_object`: any object), or
    /// `None` for free text.
    pub fn structure(&self) -> Result<Option<Value>, ApiError> {
        let Some(format) = self.response_format.as_ref().filter(|f| !f.is_null()) else { return Ok(None) };
        let bad = |param: &str, message: String| Err(ApiError::field(param, message));
        let Some(fields) = format.as_object() else {
            return bad("response_format", "response_format must be an object with a `type`".into());
        };
        let allowed: &[&str] = match fields.get("type").and_then(Value::as_str) {
            Some("text") => &["type"],
            Some("json_object") => &["type"],
            Some("json_schema") => &["type", "json_schema"],
            _ => {
                return bad(
                    "response_format.type",
                    "response_format's type must be text, json_object or json_schema".into(),
                );
            }
        };
        if let Some(key) = fields.keys().find(|k| !allowed.contains(&k.as_str())) {
            return bad(&format!("response_format.{key}"), format!("unknown field `response_format.{key}`"));
        }
        match fields["type"].as_str() {
            Some("json_object") => return Ok(Some(serde_json::json!({"type": "object"}))),
            Some("json_schema") => {}
            _ => return Ok(None),
        }
        let Some(spec) = fields.get("json_schema").and_then(Value::as_object) else {
            return bad("response_format.json_schema", "json_schema needs an object with `name` and `schema`".into());
        };
        for (key, value) in spec {
            let param = format!("response_format.json_schema.{key}");
            let fits = match key.as_str() {
                "name" => value.as_str().is_some_and(|n| {
                    !n.is_empty()
                        && n.len() <= 64
                        && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
                }),
                "description" => value.is_string(),
                "strict" => value.is_boolean() || value.is_null(),
                "schema" => value.is_object() || value.is_boolean(),
                _ => return bad(&param, format!("unknown field `{param}`")),
            };
            if !fits {
                let what = match key.as_str() {
                    "name" => "a name of at most 64 letters, digits, `_` and `-`",
                    "schema" => "a JSON schema (an object)",
                    "strict" => "a boolean",
                    _ => "a string",
                };
                return bad(&param, format!("`{param}` must be {what}"));
            }
        }
        if !spec.contains_key("name") {
            return bad("response_format.json_schema.name", "json_schema needs a `name`".into());
        }
        // Without a schema, any JSON object (the schema is what strict would enforce).
        Ok(Some(spec.get("schema").cloned().unwrap_or_else(|| serde_json::json!({"type": "object"}))))
    }
}

impl CompletionBody {
    /// `logprobs: N`: each token's logprob and the N most likely (0 to 20); `None` without.
    pub fn logprobs(&self) -> Result<Option<usize>, ApiError> {
        match self.logprobs {
            Some(n) if n > MAX_TOP_LOGPROBS => {
                Err(ApiError::field("logprobs", format!("logprobs must be between 0 and {MAX_TOP_LOGPROBS}, got {n}")))
            }
            n => Ok(n),
        }
    }
}

/// `value` of field `name` within `-max..=max`.
fn within(name: &'static str, value: Option<f32>, max: f32, default: f32) -> Result<f32, ApiError> {
    match value {
        Some(v) if !(-max..=max).contains(&v) => {
            Err(ApiError::field(name, format!("{name} must be between {} and {max}, got {v}", -max)))
        }
        v => Ok(v.unwrap_or(default)),
    }
}

impl Common {
    /// Sampling settings (temperature 0: greedy), checked with messages naming the fields;
    /// `logit_bias` ids must be below `vocab`.
    pub fn sampling(&self, default_seed: u64, vocab: usize) -> Result<SamplingParams, ApiError> {
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
        if let Some(p) = self.min_p
            && !(0.0..=1.0).contains(&p)
        {
            return Err(ApiError::field("min_p", format!("min_p must be between 0 and 1, got {p}")));
        }
        let presence_penalty = within("presence_penalty", self.presence_penalty, MAX_PENALTY, 0.0)?;
        let frequency_penalty = within("frequency_penalty", self.frequency_penalty, MAX_PENALTY, 0.0)?;
        let repetition_penalty = self.repetition_penalty.unwrap_or(1.0);
        if !(repetition_penalty.is_finite() && repetition_penalty > 0.0) {
            return Err(ApiError::field(
                "repetition_penalty",
                format!("repetition_penalty must be a finite number > 0, got {repetition_penalty}"),
            ));
        }
        let mut logit_bias = Vec::new();
        for (key, &bias) in self.logit_bias.iter().flatten() {
            let token: u32 = key.parse().map_err(|_| {
                ApiError::field("logit_bias", format!("logit_bias keys must be token ids, got `{key}`"))
            })?;
            if token as usize >= vocab {
                return Err(ApiError::field(
                    "logit_bias",
                    format!("logit_bias names token {token}, outside the vocabulary of {vocab} tokens"),
                ));
            }
            if !(-MAX_LOGIT_BIAS..=MAX_LOGIT_BIAS).contains(&bias) {
                return Err(ApiError::field(
                    "logit_bias",
                    format!("logit_bias of token {token} must be between -100 and 100, got {bias}"),
                ));
            }
            logit_bias.push((token, bias));
        }
        logit_bias.sort_by_key(|b| b.0);
        Ok(SamplingParams {
            temperature,
            top_k: self.top_k,
            top_p: self.top_p,
            min_p: self.min_p,
            presence_penalty,
            frequency_penalty,
            repetition_penalty,
            logit_bias,
            seed: self.seed.unwrap_or(default_seed),
        })
    }

    /// `n`, the answers asked for, must be 1 to [`MAX_N`].
    pub fn check_n(&self) -> Result<(), ApiError> {
        match self.n {
            Some(n) if n == 0 || n > MAX_N => {
                Err(ApiError::field("n", format!("n must be between 1 and {MAX_N}, got {n}")))
            }
            _ => Ok(()),
        }
    }

    /// The answers asked for (checked by [`Common::check_n`]).
    pub fn n(&self) -> usize {
        self.n.unwrap_or(1)
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
