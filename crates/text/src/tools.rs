//! Tool calls in a model's answer: which format a model writes them in ([`ToolFormat`],
//! decided once from its chat template and vocabulary, as mlx-lm's tokenizer loader does),
//! the marker tokens around a call ([`ToolMarkers`], which the [`crate::channels`] decoder
//! reads), and each call's text parsed into a name and JSON arguments ([`ToolFormat::parse`]).
//!
//! The formats, as the families we run write them:
//! - [`ToolFormat::Json`] (Qwen 2.5, Qwen3, Hermes; mlx-lm's `json_tools`): `<tool_call>`,
//!   `{"name": ..., "arguments": {...}}`, `</tool_call>`.
//! - [`ToolFormat::Qwen3Coder`] (Qwen3.5, Qwen3-Coder): between the same markers,
//!   `<function=NAME>` and one `<parameter=P>VALUE</parameter>` per argument, each value
//!   read by the type the tool's JSON schema gives it.
//! - [`ToolFormat::Mistral`]: `[TOOL_CALLS]` then the calls to the end of the answer, as a
//!   JSON list of `{"name", "arguments"}` or as `NAME[ARGS]{...}` repeated.
//! - [`ToolFormat::Harmony`] (gpt-oss): a `commentary` message addressed
//!   `to=functions.NAME` whose text is the JSON arguments, ended by `<|call|>`.
//! - [`ToolFormat::Llama3Json`] (Llama 3.1-3.3): no markers; an answer that is JSON,
//!   `{"name": ..., "parameters": {...}}` (several joined by `;`), is the call.

use crate::tokenizer::Tokenizer;
use serde_json::{Map, Value as Json};

/// How a model writes its tool calls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ToolFormat {
    Json,
    Qwen3Coder,
    Mistral,
    Harmony,
    Llama3Json,
}

/// One call the model asked for.
#[derive(Debug, Clone, PartialEq)]
pub struct ToolCall {
    /// The model's own id for the call, where its format carries one (Mistral's may).
    pub id: Option<String>,
    pub name: String,
    /// The arguments, a JSON object.
    pub arguments: Map<String, Json>,
}

/// The marker tokens around a call in the plain formats (harmony's are its own headers).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ToolMarkers {
    pub start: u32,
    /// `None`: the call runs to the end of the answer (Mistral), or to the next start.
    pub end: Option<u32>,
}

impl ToolFormat {
    /// The format of a model whose chat template is `template` (and whose vocabulary has the
    /// harmony markers, `harmony`): read from the template's text as mlx-lm infers its tool
    /// parser; `None` for a template that writes no tool calls we can read.
    pub fn detect(template: &str, harmony: bool) -> Option<ToolFormat> {
        if harmony {
            Some(ToolFormat::Harmony)
        } else if template.contains("\"parameters\": dictionary of argument name") {
            Some(ToolFormat::Llama3Json)
        } else if template.contains("<tool_call>\\n<function=") || template.contains("<tool_call>\n<function=") {
            Some(ToolFormat::Qwen3Coder)
        } else if template.contains("[TOOL_CALLS]") {
            Some(ToolFormat::Mistral)
        } else if template.contains("<tool_call>") && template.contains("tool_call.name") {
            Some(ToolFormat::Json)
        } else {
            None
        }
    }

    pub fn name(self) -> &'static str {
        match self {
            ToolFormat::Json => "json",
            ToolFormat::Qwen3Coder => "qwen3_coder",
            ToolFormat::Mistral => "mistral",
            ToolFormat::Harmony => "harmony",
            ToolFormat::Llama3Json => "llama3_json",
        }
    }

    /// The marker texts of the plain formats: the one that starts a call, and the one that
    /// ends it, if any.
    pub fn marker_texts(self) -> Option<(&'static str, Option<&'static str>)> {
        match self {
            ToolFormat::Json | ToolFormat::Qwen3Coder => Some(("<tool_call>", Some("</tool_call>"))),
            ToolFormat::Mistral => Some(("[TOOL_CALLS]", None)),
            ToolFormat::Harmony | ToolFormat::Llama3Json => None,
        }
    }

    /// The marker ids in `tokenizer`'s vocabulary: each marker must be one token (they are in
    /// every checkpoint of these formats), else the calls could not be told apart from text.
    pub fn markers(self, tokenizer: &Tokenizer) -> Result<Option<ToolMarkers>, String> {
        let Some((start, end)) = self.marker_texts() else { return Ok(None) };
        let id = |text: &str| {
            tokenizer.token_to_id(text).ok_or_else(|| {
                format!(
                    "the chat template writes {} tool calls, but `{text}` is not one token of its vocabulary",
                    self.name()
                )
            })
        };
        Ok(Some(ToolMarkers { start: id(start)?, end: end.map(id).transpose()? }))
    }

    /// The calls in one call's text (between the markers, or harmony's recipient on the first
    /// line and the message after it); `tools` are the request's tool definitions (their
    /// parameter types decide how Qwen3-Coder's values are read).
    pub fn parse(self, text: &str, tools: &[Json]) -> Result<Vec<ToolCall>, String> {
        match self {
            ToolFormat::Json => Ok(vec![json_call(&json_value(text.trim())?)?]),
            ToolFormat::Qwen3Coder => Ok(vec![xml_call(text, tools)?]),
            ToolFormat::Mistral => mistral_calls(text.trim()),
            ToolFormat::Llama3Json => joined_calls(text.trim()),
            ToolFormat::Harmony => {
                let (recipient, body) = text.split_once('\n').unwrap_or((text, ""));
                let name = recipient.trim().strip_prefix("functions.").unwrap_or(recipient.trim());
                if name.is_empty() {
                    return Err("a tool call without a function name".into());
                }
                Ok(vec![ToolCall { id: None, name: name.to_owned(), arguments: object(json_value(body.trim())?)? }])
            }
        }
    }
}

impl ToolFormat {
    /// A grammar (llguidance's Lark) for an answer that is one call of one of `tools` (only
    /// the one named `name`, where given) in this format, its arguments valid against the
    /// tool's parameter schema: how `tool_choice` `required` or a named function is kept.
    /// `harmony` holds harmony's `<|channel|>`, `<|message|>` and `<|call|>` ids for that
    /// format. `None` where the format's tokens are missing or no tool is given.
    pub fn forced_call(
        self,
        markers: Option<ToolMarkers>,
        harmony: Option<[u32; 3]>,
        tools: &[Json],
        name: Option<&str>,
    ) -> Option<String> {
        let functions: Vec<&Json> = tools
            .iter()
            .filter_map(|t| t.get("function"))
            .filter(|f| name.is_none() || f.get("name").and_then(Json::as_str) == name)
            .collect();
        if functions.is_empty() {
            return None;
        }
        let quote = |s: &str| serde_json::to_string(s).unwrap_or_default();
        let no_parameters = serde_json::json!({"type": "object", "properties": {}, "additionalProperties": false});
        let name_of = |f: &Json| f.get("name").and_then(Json::as_str).unwrap_or_default().to_owned();
        match self {
            ToolFormat::Qwen3Coder => {
                let m = markers?;
                let end = m.end?;
                let calls: Vec<String> = functions.iter().map(|f| xml_call_rule(f, &quote)).collect();
                return Some(format!("start: <[{}]> \"\\n\" ({}) \"\\n\" <[{end}]>", m.start, calls.join(" | ")));
            }
            ToolFormat::Harmony => {
                let [channel, message, call] = harmony?;
                let calls: Vec<String> = functions
                    .iter()
                    .map(|f| {
                        let parameters = f.get("parameters").unwrap_or(&no_parameters);
                        format!(
                            "<[{channel}]> {} <[{message}]> %json {} <[{call}]>",
                            quote(&format!("commentary to=functions.{} json", name_of(f))),
                            crate::constraint::compact(parameters)
                        )
                    })
                    .collect();
                return Some(format!("start: {}", calls.join(" | ")));
            }
            _ => {}
        }
        // The key the format writes the arguments under.
        let arguments = if self == ToolFormat::Llama3Json { "parameters" } else { "arguments" };
        let calls: Vec<Json> = functions
            .iter()
            .map(|f| {
                // A function without parameters takes none (OpenAI's reading).
                let parameters = f.get("parameters").cloned().unwrap_or_else(|| no_parameters.clone());
                let mut properties = serde_json::Map::new();
                properties.insert("name".into(), serde_json::json!({"const": name_of(f)}));
                properties.insert(arguments.into(), parameters);
                serde_json::json!({
                    "type": "object",
                    "properties": properties,
                    "required": ["name", arguments],
                    "additionalProperties": false,
                })
            })
            .collect();
        let call = serde_json::json!({"anyOf": calls});
        if self == ToolFormat::Llama3Json {
            return Some(format!("start: %json {}", crate::constraint::compact(&call)));
        }
        let markers = markers?;
        match self {
            ToolFormat::Json => {
                let end = markers.end?;
                Some(format!(
                    "start: <[{}]> \"\\n\" %json {} \"\\n\" <[{end}]>",
                    markers.start,
                    crate::constraint::compact(&call)
                ))
            }
            ToolFormat::Mistral => {
                let list = serde_json::json!({"type": "array", "items": call, "minItems": 1});
                Some(format!("start: <[{}]> %json {}", markers.start, crate::constraint::compact(&list)))
            }
            ToolFormat::Qwen3Coder | ToolFormat::Harmony | ToolFormat::Llama3Json => None,
        }
    }
}

/// One Qwen3-Coder call of function `f` as a Lark expression: `<function=NAME>`, then each
/// required parameter in order and each other one optionally, `<parameter=P>`, its value
/// and `</parameter>` on lines of their own, then `</function>`. A string is written as it
/// is (no `<`), one of an enum's strings too; any other value as JSON valid against its
/// schema (an integer, a number and a boolean are written so in this format too).
fn xml_call_rule(f: &Json, quote: &dyn Fn(&str) -> String) -> String {
    let name = f.get("name").and_then(Json::as_str).unwrap_or_default();
    let properties = f.get("parameters").and_then(|p| p.get("properties")).and_then(Json::as_object);
    let required: Vec<&str> = f
        .get("parameters")
        .and_then(|p| p.get("required"))
        .and_then(Json::as_array)
        .map(|r| r.iter().filter_map(Json::as_str).collect())
        .unwrap_or_default();
    let value = |schema: &Json| -> String {
        if let Some(options) = schema.get("enum").and_then(Json::as_array)
            && options.iter().all(Json::is_string)
        {
            let options: Vec<String> = options.iter().filter_map(Json::as_str).map(quote).collect();
            return format!("({})", options.join(" | "));
        }
        match schema.get("type").and_then(Json::as_str) {
            Some("string") => "/[^<]*/".to_owned(),
            _ => format!("%json {}", crate::constraint::compact(schema)),
        }
    };
    let mut out = vec![quote(&format!("<function={name}>\n"))];
    let mut parameters: Vec<(&String, &Json)> = properties.map(|p| p.iter().collect()).unwrap_or_default();
    // Required ones first, in the schema's order of `required`.
    parameters.sort_by_key(|(p, _)| required.iter().position(|r| r == p).unwrap_or(usize::MAX));
    for (parameter, schema) in parameters {
        let one =
            format!("{} {} {}", quote(&format!("<parameter={parameter}>\n")), value(schema), quote("\n</parameter>\n"));
        out.push(if required.contains(&parameter.as_str()) { one } else { format!("({one})?") });
    }
    out.push(quote("</function>"));
    format!("({})", out.join(" "))
}

fn json_value(text: &str) -> Result<Json, String> {
    serde_json::from_str(text).map_err(|e| format!("a tool call that is not JSON ({e})"))
}

fn object(value: Json) -> Result<Map<String, Json>, String> {
    match value {
        Json::Object(map) => Ok(map),
        // Some templates render arguments as a JSON string.
        Json::String(s) => object(json_value(&s)?),
        other => Err(format!("tool call arguments must be a JSON object, got {other}")),
    }
}

/// `{"name": ..., "arguments": {...}}` (Llama's spelling `parameters` too).
fn json_call(value: &Json) -> Result<ToolCall, String> {
    let name = value.get("name").and_then(Json::as_str).ok_or("a tool call without a string `name`")?;
    let arguments = value.get("arguments").or_else(|| value.get("parameters")).cloned().unwrap_or(Json::Null);
    let arguments = if arguments.is_null() { Map::new() } else { object(arguments)? };
    let id = value.get("id").and_then(Json::as_str).map(str::to_owned);
    Ok(ToolCall { id, name: name.to_owned(), arguments })
}

/// Llama 3's calls: JSON objects, joined by `;` where there are several.
fn joined_calls(text: &str) -> Result<Vec<ToolCall>, String> {
    let mut calls = Vec::new();
    let mut rest = text;
    loop {
        let mut values = serde_json::Deserializer::from_str(rest).into_iter::<Json>();
        match values.next() {
            Some(Ok(value)) => calls.push(json_call(&value)?),
            _ => return Err(format!("a tool call that is not JSON: `{rest}`")),
        }
        rest = rest[values.byte_offset()..].trim_start();
        match rest.strip_prefix(';') {
            Some(more) if !more.trim().is_empty() => rest = more,
            Some(_) => return Ok(calls),
            None if rest.is_empty() => return Ok(calls),
            None => return Err(format!("text after a tool call: `{rest}`")),
        }
    }
}

/// Mistral's calls: a JSON list, or `NAME[ARGS]{...}` repeated.
fn mistral_calls(text: &str) -> Result<Vec<ToolCall>, String> {
    if let Ok(Json::Array(calls)) = serde_json::from_str::<Json>(text) {
        return calls.iter().map(json_call).collect();
    }
    let mut calls = Vec::new();
    let mut rest = text;
    while let Some(at) = rest.find("[ARGS]") {
        let name = rest[..at].trim();
        if name.is_empty() || !name.chars().all(|c| c.is_alphanumeric() || c == '_' || c == '-') {
            return Err(format!("a tool call with the name `{name}`"));
        }
        let mut values = serde_json::Deserializer::from_str(&rest[at + "[ARGS]".len()..]).into_iter::<Json>();
        let arguments = match values.next() {
            Some(Ok(value)) => object(value)?,
            _ => return Err(format!("the arguments of tool call `{name}` are not JSON (cut short?)")),
        };
        let end = at + "[ARGS]".len() + values.byte_offset();
        calls.push(ToolCall { id: None, name: name.to_owned(), arguments });
        rest = &rest[end..];
    }
    if calls.is_empty() || !rest.trim().is_empty() {
        return Err(format!("no tool call in `{text}`"));
    }
    Ok(calls)
}

/// Qwen3-Coder's `<function=NAME>` with `<parameter=P>\nVALUE\n</parameter>` per argument.
fn xml_call(text: &str, tools: &[Json]) -> Result<ToolCall, String> {
    let body = text.trim();
    let rest = body.strip_prefix("<function=").ok_or("a tool call without `<function=`")?;
    let rest = rest.strip_suffix("</function>").ok_or("a tool call without `</function>` (cut short?)")?;
    let (name, mut params) = rest.split_once('>').ok_or("a tool call without a function name")?;
    let name = name.trim();
    if name.is_empty() {
        return Err("a tool call without a function name".into());
    }
    let schema = tools
        .iter()
        .filter_map(|t| t.get("function"))
        .find(|f| f.get("name").and_then(Json::as_str) == Some(name))
        .and_then(|f| f.get("parameters"))
        .and_then(|p| p.get("properties"));
    let mut arguments = Map::new();
    while let Some(at) = params.find("<parameter=") {
        let after = &params[at + "<parameter=".len()..];
        let (param, value_and_rest) = after.split_once('>').ok_or("a parameter without a name")?;
        let (value, rest) =
            value_and_rest.split_once("</parameter>").ok_or("a parameter without `</parameter>` (cut short?)")?;
        let value = value.strip_prefix('\n').unwrap_or(value);
        let value = value.strip_suffix('\n').unwrap_or(value);
        let param = param.trim();
        arguments.insert(param.to_owned(), typed(value, schema.and_then(|s| s.get(param))));
        params = rest;
    }
    Ok(ToolCall { id: None, name: name.to_owned(), arguments })
}

/// A Qwen3-Coder value read by its schema's `type`: strings as written, numbers and booleans
/// parsed, objects and arrays as JSON; a value that does not read as its type stays a string.
fn typed(value: &str, schema: Option<&Json>) -> Json {
    if value.eq_ignore_ascii_case("null") {
        return Json::Null;
    }
    let string = || Json::String(value.to_owned());
    let Some(kind) = schema.and_then(|s| s.get("type")).and_then(Json::as_str).map(str::to_ascii_lowercase) else {
        return match serde_json::from_str::<Json>(value) {
            Ok(v @ (Json::Object(_) | Json::Array(_))) => v,
            _ => string(),
        };
    };
    match kind.as_str() {
        "string" | "str" | "text" | "enum" => string(),
        "integer" | "int" => value.trim().parse::<i64>().map_or_else(|_| string(), Json::from),
        "number" | "float" => match value.trim().parse::<f64>() {
            Ok(f) if f.fract() == 0.0 && f.abs() < 9.0e15 => Json::from(f as i64),
            Ok(f) => serde_json::Number::from_f64(f).map_or_else(string, Json::Number),
            Err(_) => string(),
        },
        "boolean" | "bool" => Json::Bool(value.trim().eq_ignore_ascii_case("true")),
        _ => serde_json::from_str(value).unwrap_or_else(|_| string()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn call(name: &str, arguments: Json) -> ToolCall {
        ToolCall { id: None, name: name.into(), arguments: arguments.as_object().unwrap().clone() }
    }

    #[test]
    fn formats_are_read_from_the_template() {
        let json_tools = "{% for tool_call in message.tool_calls %}<tool_call>\n{{ tool_call.name }}{% endfor %}";
        assert_eq!(ToolFormat::detect(json_tools, false), Some(ToolFormat::Json));
        let coder = "{{- '<tool_call>\\n<function=' + tool_call.name + '>\\n' }}";
        assert_eq!(ToolFormat::detect(coder, false), Some(ToolFormat::Qwen3Coder));
        assert_eq!(ToolFormat::detect("{{ '[TOOL_CALLS]' }}", false), Some(ToolFormat::Mistral));
        assert_eq!(ToolFormat::detect("{{ messages }}", true), Some(ToolFormat::Harmony));
        let llama = "Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.";
        assert_eq!(ToolFormat::detect(llama, false), Some(ToolFormat::Llama3Json));
        assert_eq!(ToolFormat::detect("<|im_start|>{{ message.content }}", false), None);
    }

    #[test]
    fn json_calls() {
        let text = "\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\", \"days\": 2}}\n";
        assert_eq!(
            ToolFormat::Json.parse(text, &[]),
            Ok(vec![call("get_weather", json!({"city": "Paris", "days": 2}))])
        );
        // Arguments as a JSON string, and Llama's `parameters`.
        let text = r#"{"name": "f", "arguments": "{\"a\": 1}"}"#;
        assert_eq!(ToolFormat::Json.parse(text, &[]), Ok(vec![call("f", json!({"a": 1}))]));
        assert_eq!(ToolFormat::Json.parse(r#"{"name": "f", "parameters": {}}"#, &[]), Ok(vec![call("f", json!({}))]));
        assert!(ToolFormat::Json.parse(r#"{"name": "f", "arguments": {"a": "#, &[]).unwrap_err().contains("not JSON"));
        assert!(ToolFormat::Json.parse(r#"{"arguments": {}}"#, &[]).unwrap_err().contains("`name`"));
        assert!(ToolFormat::Json.parse(r#"{"name": "f", "arguments": [1]}"#, &[]).unwrap_err().contains("object"));
    }

    #[test]
    fn mistral_calls_as_a_list_and_as_headers() {
        let list = r#" [{"name": "a", "arguments": {"x": 1}, "id": "abc123XYZ"}, {"name": "b", "arguments": {}}]"#;
        let mut first = call("a", json!({"x": 1}));
        first.id = Some("abc123XYZ".into());
        assert_eq!(ToolFormat::Mistral.parse(list, &[]), Ok(vec![first, call("b", json!({}))]));
        let headers = r#"get_weather[ARGS]{"city": "Paris"}search[ARGS]{"q": "x"}"#;
        assert_eq!(
            ToolFormat::Mistral.parse(headers, &[]),
            Ok(vec![call("get_weather", json!({"city": "Paris"})), call("search", json!({"q": "x"}))])
        );
        assert!(ToolFormat::Mistral.parse(r#"f[ARGS]{"city": "Par"#, &[]).unwrap_err().contains("cut short"));
        assert!(ToolFormat::Mistral.parse("just text", &[]).is_err());
    }

    #[test]
    fn qwen3_coder_values_follow_the_schema() {
        let tools = [json!({"type": "function", "function": {"name": "book", "parameters": {"type": "object",
            "properties": {"city": {"type": "string"}, "nights": {"type": "integer"}, "price": {"type": "number"},
                           "pets": {"type": "boolean"}, "rooms": {"type": "array"}}}}})];
        let text = "\n<function=book>\n<parameter=city>\n42\n</parameter>\n<parameter=nights>\n3\n</parameter>\n\
                    <parameter=price>\n99.5\n</parameter>\n<parameter=pets>\nTrue\n</parameter>\n\
                    <parameter=rooms>\n[1, 2]\n</parameter>\n<parameter=note>\nnull\n</parameter>\n\
                    <parameter=other>\n{\"a\": 1}\n</parameter>\n</function>\n";
        let want = json!({"city": "42", "nights": 3, "price": 99.5, "pets": true, "rooms": [1, 2], "note": null,
                          "other": {"a": 1}});
        assert_eq!(ToolFormat::Qwen3Coder.parse(text, &tools), Ok(vec![call("book", want)]));
        assert!(ToolFormat::Qwen3Coder.parse("<function=book>\n<parameter=city>\nPa", &tools).is_err());
    }

    #[test]
    fn llama3_calls_are_the_answers_json() {
        let text =
            r#"{"name": "get_weather", "parameters": {"city": "Paris"}}; {"name": "get_time", "parameters": {}}"#;
        assert_eq!(
            ToolFormat::Llama3Json.parse(text, &[]),
            Ok(vec![call("get_weather", json!({"city": "Paris"})), call("get_time", json!({}))])
        );
        assert!(ToolFormat::Llama3Json.parse(r#"{"name": "f", "parameters": {}} and more"#, &[]).is_err());
        assert!(ToolFormat::Llama3Json.parse("{\"name\": \"f\", \"param", &[]).is_err());
        let grammar =
            ToolFormat::Llama3Json.forced_call(None, None, &[json!({"function": {"name": "f"}})], None).unwrap();
        assert!(grammar.starts_with("start: %json {") && grammar.contains("\"parameters\""), "{grammar}");
    }

    #[test]
    fn harmony_calls_name_their_recipient() {
        assert_eq!(
            ToolFormat::Harmony.parse("functions.get_weather\n{\"city\": \"Paris\"}", &[]),
            Ok(vec![call("get_weather", json!({"city": "Paris"}))])
        );
        assert!(ToolFormat::Harmony.parse("functions.f\n{", &[]).is_err());
    }
}
