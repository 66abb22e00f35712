//! Chat prompts: the model folder's Jinja chat template rendered with minijinja the way
//! transformers renders it (trim_blocks, lstrip_blocks, loop controls, Python string methods,
//! `raise_exception`, `strftime_now`), so prompt ids match what mlx-lm feeds the model.

use crate::tokenizer::{Tokenizer, TokenizerError, read_json_opt, special_token};
use minijinja::value::Kwargs;
use minijinja::{Environment, Error as JinjaError, ErrorKind, Value};
use serde::{Deserialize, Serialize};
use serde_json::Value as Json;
use std::path::{Path, PathBuf};

/// Everything that can go wrong finding, parsing or rendering a chat template.
#[derive(Debug, thiserror::Error)]
pub enum ChatError {
    #[error("model {} has no chat template (no chat_template.jinja, no chat_template in tokenizer_config.json)", dir.display())]
    NoTemplate { dir: PathBuf },
    #[error(transparent)]
    Config(#[from] TokenizerError),
    #[error("{}: {what}", path.display())]
    Invalid { path: PathBuf, what: String },
    #[error("{}: chat template does not parse: {reason}", path.display())]
    Syntax { path: PathBuf, reason: String },
    #[error("{}: chat template failed: {reason}", path.display())]
    Render { path: PathBuf, reason: String },
}

type Result<T> = std::result::Result<T, ChatError>;

/// One chat turn as templates see it: `message['role']`, `message['content']`, and for tool
/// use (left undefined when unset, as templates test with `is defined`) an assistant turn's
/// `tool_calls` (OpenAI's `{id, type, function: {name, arguments}}`, the arguments a JSON
/// object as transformers' templates expect), a `tool` turn's `tool_call_id`, and `name`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Message {
    pub role: String,
    pub content: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_calls: Option<Vec<Arg>>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub tool_call_id: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
}

impl Message {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Self {
        Self { role: role.into(), content: content.into(), tool_calls: None, tool_call_id: None, name: None }
    }

    /// A `user` turn.
    pub fn user(content: impl Into<String>) -> Self {
        Self::new("user", content)
    }
}

/// A value handed to a template: a string, or JSON as a request wrote it, its objects' keys
/// in their order (transformers passes the request's dicts, and `tojson` prints them in that
/// order), whatever features `serde_json` was built with.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Arg(Value);

impl Arg {
    pub fn str(s: &str) -> Arg {
        Arg(Value::from(s))
    }

    /// JSON text, its keys kept in order.
    pub fn parse(json: &str) -> serde_json::Result<Arg> {
        serde_json::from_str(json)
    }

    /// An object of these keys and values, in this order.
    pub fn object<'a>(pairs: impl IntoIterator<Item = (&'a str, Arg)>) -> Arg {
        Arg(Value::from_pairs(pairs.into_iter().map(|(k, v)| (k, v.0))))
    }

    /// A list of these values.
    pub fn list(items: impl IntoIterator<Item = Arg>) -> Arg {
        Arg(Value::from_iter(items.into_iter().map(|a| a.0)))
    }

    /// The item at `key` of an object.
    pub fn get(&self, key: &str) -> Option<Arg> {
        self.0.get_attr(key).ok().filter(|v| !v.is_undefined()).map(Arg)
    }

    /// The value as `serde_json` has it, to check or read it.
    pub fn to_json(&self) -> Json {
        serde_json::to_value(&self.0).unwrap_or(Json::Null)
    }
}

const TEMPLATE_NAME: &str = "chat_template";
/// The special tokens transformers hands to templates, when tokenizer_config.json sets them.
const SPECIAL_TOKEN_KEYS: [&str; 4] = ["bos_token", "eos_token", "unk_token", "pad_token"];

/// A model's chat template, ready to render.
#[derive(Debug)]
pub struct ChatTemplate {
    env: Environment<'static>,
    /// The file the template came from, for error messages.
    path: PathBuf,
    /// `bos_token`, `eos_token`, ... as strings, in the order of SPECIAL_TOKEN_KEYS.
    special_tokens: Vec<(&'static str, String)>,
    source: String,
}

impl ChatTemplate {
    /// The template of the model in `dir`: `chat_template.jinja` if present, else
    /// `chat_template` of `tokenizer_config.json` (a string, or a list of `{name, template}` of
    /// which "default" is used). No template at all is [`ChatError::NoTemplate`].
    pub fn from_dir(dir: &Path) -> Result<Self> {
        let config_path = dir.join("tokenizer_config.json");
        let config = read_json_opt(&config_path)?.unwrap_or(Json::Null);
        let mut special_tokens = Vec::new();
        for key in SPECIAL_TOKEN_KEYS {
            if let Some(token) = special_token(&config, key, &config_path)? {
                special_tokens.push((key, token));
            }
        }
        let jinja_path = dir.join("chat_template.jinja");
        let (path, source) = if jinja_path.exists() {
            let source = std::fs::read_to_string(&jinja_path)
                .map_err(|source| TokenizerError::Io { path: jinja_path.clone(), source })?;
            (jinja_path, source)
        } else {
            match template_in_config(&config, &config_path)? {
                Some(source) => (config_path, source),
                None => {
                    return Err(ChatError::NoTemplate { dir: dir.to_owned() });
                }
            }
        };
        Self::from_source(source, path, special_tokens)
    }

    /// A template from its source text; `path` is named in errors.
    pub fn from_source(source: String, path: PathBuf, special_tokens: Vec<(&'static str, String)>) -> Result<Self> {
        let mut env = Environment::new();
        // transformers renders with jinja2's ImmutableSandboxedEnvironment(trim_blocks=True,
        // lstrip_blocks=True) plus the loopcontrols extension; match its whitespace rules.
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| ChatError::Syntax { path: path.clone(), reason: e.to_string() })?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.add_template_owned(TEMPLATE_NAME, source.clone())
            .map_err(|e| ChatError::Syntax { path: path.clone(), reason: one_line(&e) })?;
        Ok(Self { env, path, special_tokens, source })
    }

    /// The file the template was read from.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The prompt text for `messages`; `add_generation_prompt` opens the assistant's turn.
    pub fn render(&self, messages: &[Message], add_generation_prompt: bool) -> Result<String> {
        self.render_with(messages, add_generation_prompt, &[])
    }

    /// [`ChatTemplate::render`] with more variables for the template (`reasoning_effort`,
    /// `tools`, as transformers passes its keyword arguments).
    pub fn render_with(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
        vars: &[(&str, Arg)],
    ) -> Result<String> {
        let mut ctx: Vec<(&str, Value)> = vec![
            ("messages", Value::from(minijinja::value::Serde(messages))),
            ("add_generation_prompt", Value::from(add_generation_prompt)),
        ];
        ctx.extend(vars.iter().map(|(k, v)| (*k, v.0.clone())));
        // Unset tokens stay undefined (rendering as ""), as in transformers; `none` would print.
        ctx.extend(self.special_tokens.iter().map(|(k, v)| (*k, Value::from(v.as_str()))));
        let ctx = Value::from_pairs(ctx);
        let template = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| ChatError::Syntax { path: self.path.clone(), reason: one_line(&e) })?;
        template.render(ctx).map_err(|e| ChatError::Render { path: self.path.clone(), reason: one_line(&e) })
    }

    /// Prompt ids for `messages` with the generation prompt, tokenized as transformers'
    /// `apply_chat_template(tokenize=True)` does: the template writes every special token
    /// itself, so the tokenizer adds none.
    pub fn encode(&self, tokenizer: &Tokenizer, messages: &[Message]) -> Result<Vec<u32>> {
        self.encode_with(tokenizer, messages, &[])
    }

    /// [`ChatTemplate::encode`] with more variables ([`ChatTemplate::render_with`]).
    pub fn encode_with(&self, tokenizer: &Tokenizer, messages: &[Message], vars: &[(&str, Arg)]) -> Result<Vec<u32>> {
        let text = self.render_with(messages, true, vars)?;
        Ok(tokenizer.encode(&text, false)?)
    }

    /// Whether the template reads the variable `name` (gpt-oss's reads `reasoning_effort`).
    pub fn reads(&self, name: &str) -> bool {
        self.env.get_template(TEMPLATE_NAME).is_ok_and(|t| t.undeclared_variables(false).contains(name))
    }

    /// The template's source text.
    pub fn source(&self) -> &str {
        &self.source
    }
}

/// `chat_template` of tokenizer_config.json, if any.
fn template_in_config(config: &Json, path: &Path) -> Result<Option<String>> {
    let invalid = |what: String| ChatError::Invalid { path: path.to_owned(), what };
    match config.get("chat_template") {
        None | Some(Json::Null) => Ok(None),
        Some(Json::String(s)) => Ok(Some(s.clone())),
        Some(Json::Array(named)) => {
            let mut names = Vec::new();
            for entry in named {
                let name = entry.get("name").and_then(Json::as_str);
                let template = entry.get("template").and_then(Json::as_str);
                match (name, template) {
                    (Some("default"), Some(t)) => return Ok(Some(t.to_owned())),
                    (Some(n), Some(_)) => names.push(n.to_owned()),
                    _ => {
                        return Err(invalid("chat_template list entries need string \"name\" and \"template\"".into()));
                    }
                }
            }
            Err(invalid(format!("chat_template has no \"default\" entry (it has {})", names.join(", "))))
        }
        Some(other) => {
            Err(invalid(format!("chat_template must be a string or a list of {{name, template}}, got {other}")))
        }
    }
}

/// minijinja's error with its location, on one line.
fn one_line(e: &JinjaError) -> String {
    let mut text = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        text.push_str(": ");
        text.push_str(&cause.to_string());
        source = cause.source();
    }
    text.replace('\n', " ")
}

/// `tojson` as transformers defines it for templates: Python's `json.dumps(value,
/// ensure_ascii=False, indent=..., sort_keys=...)`, so `", "` and `": "` between items (`","`
/// and newlines with an indent), keys in their order, non-ASCII as is. (minijinja's own is
/// compact and escapes HTML characters, which would change the prompt.)
fn tojson(value: Value, kwargs: Kwargs) -> std::result::Result<Value, JinjaError> {
    let indent: Option<Value> = kwargs.get("indent")?;
    let sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let fail = |e: serde_json::Error| JinjaError::new(ErrorKind::InvalidOperation, format!("tojson: {e}"));
    let indent = match indent {
        None => None,
        Some(v) if v.is_none() => None,
        Some(v) => Some(match v.as_usize() {
            Some(n) => " ".repeat(n),
            None => v.as_str().map(str::to_owned).ok_or_else(|| {
                JinjaError::new(ErrorKind::InvalidOperation, "tojson: indent must be a number or a string")
            })?,
        }),
    };
    let text = if sort_keys == Some(true) {
        dump(&sorted(serde_json::to_value(&value).map_err(fail)?), indent.as_deref())
    } else {
        dump(&value, indent.as_deref())
    }
    .map_err(fail)?;
    Ok(Value::from_safe_string(text))
}

/// `value` with every object's keys in sorted order (serde_json keeps them as inserted).
fn sorted(value: Json) -> Json {
    match value {
        Json::Object(map) => {
            let mut entries: Vec<(String, Json)> = map.into_iter().collect();
            entries.sort_by(|a, b| a.0.cmp(&b.0));
            Json::Object(entries.into_iter().map(|(k, v)| (k, sorted(v))).collect())
        }
        Json::Array(items) => Json::Array(items.into_iter().map(sorted).collect()),
        other => other,
    }
}

/// `value` as JSON text: Python's separators, or an indent of `unit` per level.
fn dump<T: Serialize>(value: &T, unit: Option<&str>) -> serde_json::Result<String> {
    let mut out = Vec::new();
    match unit {
        Some(unit) => value.serialize(&mut serde_json::Serializer::with_formatter(
            &mut out,
            serde_json::ser::PrettyFormatter::with_indent(unit.as_bytes()),
        ))?,
        None => value.serialize(&mut serde_json::Serializer::with_formatter(&mut out, PythonFormatter))?,
    }
    Ok(String::from_utf8(out).unwrap_or_default())
}

/// Python's default JSON separators: `", "` and `": "`.
struct PythonFormatter;

impl serde_json::ser::Formatter for PythonFormatter {
    fn begin_array_value<W: ?Sized + std::io::Write>(&mut self, writer: &mut W, first: bool) -> std::io::Result<()> {
        if first { Ok(()) } else { writer.write_all(b", ") }
    }

    fn begin_object_key<W: ?Sized + std::io::Write>(&mut self, writer: &mut W, first: bool) -> std::io::Result<()> {
        if first { Ok(()) } else { writer.write_all(b", ") }
    }

    fn begin_object_value<W: ?Sized + std::io::Write>(&mut self, writer: &mut W) -> std::io::Result<()> {
        writer.write_all(b": ")
    }
}

/// Templates call `raise_exception('...')` to reject conversations they cannot format.
fn raise_exception(message: String) -> std::result::Result<Value, JinjaError> {
    Err(JinjaError::new(ErrorKind::InvalidOperation, format!("raise_exception: {message}")))
}

/// `strftime_now(format)` as transformers provides it (Llama 3 templates print today's date).
/// The time is UTC; transformers uses the local zone.
fn strftime_now(format: String) -> std::result::Result<String, JinjaError> {
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_err(|e| JinjaError::new(ErrorKind::InvalidOperation, format!("strftime_now: clock before 1970: {e}")))?;
    let secs = i64::try_from(now.as_secs())
        .map_err(|_| JinjaError::new(ErrorKind::InvalidOperation, "strftime_now: clock out of range"))?;
    strftime(&format, secs)
        .map_err(|what| JinjaError::new(ErrorKind::InvalidOperation, format!("strftime_now: {what}")))
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = ["Sunday", "Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday"];

/// Formats a Unix time (UTC) with the common C `strftime` directives.
pub(crate) fn strftime(format: &str, unix_secs: i64) -> std::result::Result<String, String> {
    let days = unix_secs.div_euclid(86_400);
    let secs_of_day = unix_secs.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (secs_of_day / 3600, secs_of_day / 60 % 60, secs_of_day % 60);
    // 1970-01-01 was a Thursday.
    let weekday = usize::try_from((days + 4).rem_euclid(7)).unwrap_or(0);
    let day_of_year = days - days_from_civil(year, 1, 1) + 1;
    let month_name = MONTHS[usize::try_from(month - 1).unwrap_or(0)];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let directive = chars.next().ok_or_else(|| "format ends with a lone %".to_owned())?;
        match directive {
            'Y' => out.push_str(&year.to_string()),
            'y' => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            'm' => out.push_str(&format!("{month:02}")),
            'd' => out.push_str(&format!("{day:02}")),
            'e' => out.push_str(&format!("{day:>2}")),
            'j' => out.push_str(&format!("{day_of_year:03}")),
            'B' => out.push_str(month_name),
            'b' | 'h' => out.push_str(&month_name[..3]),
            'A' => out.push_str(WEEKDAYS[weekday]),
            'a' => out.push_str(&WEEKDAYS[weekday][..3]),
            'H' => out.push_str(&format!("{hour:02}")),
            'I' => out.push_str(&format!("{:02}", (hour + 11) % 12 + 1)),
            'p' => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            'M' => out.push_str(&format!("{minute:02}")),
            'S' => out.push_str(&format!("{second:02}")),
            '%' => out.push('%'),
            other => return Err(format!("unsupported directive %{other}")),
        }
    }
    Ok(out)
}

/// (year, month 1-12, day 1-31) of a day count since 1970-01-01 (proleptic Gregorian; H. Hinnant).
fn civil_from_days(days: i64) -> (i64, i64, i64) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = doy - (153 * mp + 2) / 5 + 1;
    let month = if mp < 10 { mp + 3 } else { mp - 9 };
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// Inverse of [`civil_from_days`].
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = if month > 2 { month - 3 } else { month + 9 };
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::test_model::{dir, ids, trajectory};

    fn template(dir: &Path) -> ChatTemplate {
        ChatTemplate::from_dir(dir).unwrap()
    }

    fn write(dir: &Path, name: &str, text: &str) {
        std::fs::write(dir.join(name), text).unwrap();
    }

    #[test]
    fn smollm_chat_prompt_matches_mlx_lm() {
        let tok = Tokenizer::from_dir(&dir()).unwrap();
        let chat = template(&dir());
        assert_eq!(chat.path(), dir().join("chat_template.jinja"));
        let oracle = trajectory("chat");
        let messages = [Message::user(oracle["message"].as_str().unwrap())];
        assert_eq!(messages[0].content, "What is the capital of France?");
        let text = chat.render(&messages, true).unwrap();
        assert_eq!(text, oracle["prompt_text"].as_str().unwrap());
        assert!(text.starts_with(
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        ));
        let prompt = chat.encode(&tok, &messages).unwrap();
        assert_eq!(prompt, ids(&oracle["prompt_ids"]));
        assert_eq!(prompt.len(), 37);
        assert_eq!(prompt[..3], [1, 9690, 198]);
    }

    #[test]
    fn smollm_system_message_replaces_the_default_and_no_generation_prompt() {
        let chat = template(&dir());
        let messages = [Message::new("system", "Be brief."), Message::user("Hi")];
        assert_eq!(
            chat.render(&messages, false).unwrap(),
            "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHi<|im_end|>\n"
        );
    }

    #[test]
    fn no_template_is_an_error_naming_the_folder() {
        let d = tempfile::tempdir().unwrap();
        let want = format!(
            "model {} has no chat template (no chat_template.jinja, no chat_template in tokenizer_config.json)",
            d.path().display()
        );
        assert_eq!(ChatTemplate::from_dir(d.path()).unwrap_err().to_string(), want);
        write(d.path(), "tokenizer_config.json", r#"{"eos_token": "</s>"}"#);
        assert_eq!(ChatTemplate::from_dir(d.path()).unwrap_err().to_string(), want);
    }

    #[test]
    fn template_sources_in_order() {
        let d = tempfile::tempdir().unwrap();
        let msgs = [Message::user("hi")];
        write(
            d.path(),
            "tokenizer_config.json",
            r#"{"chat_template": "cfg:{{ bos_token }}{{ messages[0].content }}{{ eos_token }}",
                "bos_token": {"__type": "AddedToken", "content": "<s>"}, "eos_token": "</s>"}"#,
        );
        assert_eq!(template(d.path()).render(&msgs, true).unwrap(), "cfg:<s>hi</s>");
        assert_eq!(template(d.path()).path(), d.path().join("tokenizer_config.json"));

        write(
            d.path(),
            "tokenizer_config.json",
            r#"{"chat_template": [{"name": "tool_use", "template": "tools"},
                                  {"name": "default", "template": "default:{{ messages | length }}"}]}"#,
        );
        assert_eq!(template(d.path()).render(&msgs, true).unwrap(), "default:1");

        // chat_template.jinja wins over tokenizer_config.json; unset tokens render empty.
        write(d.path(), "chat_template.jinja", "file:[{{ bos_token }}]{{ messages[0]['role'] }}\n");
        assert_eq!(template(d.path()).render(&msgs, true).unwrap(), "file:[]user");

        std::fs::remove_file(d.path().join("chat_template.jinja")).unwrap();
        write(d.path(), "tokenizer_config.json", r#"{"chat_template": [{"name": "tool_use", "template": "t"}]}"#);
        let err = ChatTemplate::from_dir(d.path()).unwrap_err().to_string();
        let path = d.path().join("tokenizer_config.json");
        assert_eq!(err, format!("{}: chat_template has no \"default\" entry (it has tool_use)", path.display()));

        write(d.path(), "tokenizer_config.json", r#"{"chat_template": 3}"#);
        let err = ChatTemplate::from_dir(d.path()).unwrap_err().to_string();
        assert_eq!(
            err,
            format!("{}: chat_template must be a string or a list of {{name, template}}, got 3", path.display())
        );

        write(d.path(), "tokenizer_config.json", r#"{"chat_template": "x", "eos_token": 5}"#);
        let err = ChatTemplate::from_dir(d.path()).unwrap_err().to_string();
        assert_eq!(err, format!("{}: eos_token must be a string or an object with \"content\", got 5", path.display()));
    }

    /// The whitespace, loop-control and Python-method behaviour of transformers' jinja2 setup.
    #[test]
    fn renders_like_transformers() {
        let template = "\
{% for message in messages %}
  {% if loop.index0 == 2 %}{% break %}{% endif %}
  {% if message.content.strip().startswith('#') %}{% continue %}{% endif %}
  {{ message['role'].upper() }}: {{ message.content.strip() | replace('  ', ' ') }}
{% endfor %}
{% if add_generation_prompt %}
ASSISTANT:
{% endif %}
";
        let chat = ChatTemplate::from_source(template.into(), "t.jinja".into(), Vec::new()).unwrap();
        let msgs = [Message::user("  hello  world "), Message::user("# skipped"), Message::user("never")];
        // Expected strings are jinja2 3.1.6's output with transformers' settings.
        assert_eq!(chat.render(&msgs, true).unwrap(), "  USER: hello world\nASSISTANT:\n");
        assert_eq!(chat.render(&msgs[..1], false).unwrap(), "  USER: hello world\n");
    }

    /// Tools and a tool-call turn, rendered as jinja2 3.1.6 with transformers' `tojson`
    /// renders them (the expected string is its output for this template).
    #[test]
    fn tools_and_tool_turns_render_like_transformers() {
        let template = r#"{% if tools %}
<|im_start|>system
# Tools
<tools>
{% for tool in tools %}
{{ tool | tojson }}
{% endfor %}
</tools><|im_end|>
{% endif %}
{% for message in messages %}
{% if message.role == 'assistant' and message.tool_calls is defined %}
<|im_start|>assistant
{% for tool_call in message.tool_calls %}
{% set call = tool_call.function %}
<tool_call>
{"name": "{{ call.name }}", "arguments": {{ call.arguments | tojson }}}
</tool_call>
{% endfor %}
<|im_end|>
{% elif message.role == 'tool' %}
<|im_start|>user
<tool_response id="{{ message.tool_call_id }}">
{{ message.content }}
</tool_response><|im_end|>
{% else %}
<|im_start|>{{ message.role }}
{{ message.content }}<|im_end|>
{% endif %}
{% endfor %}
{% if add_generation_prompt %}
<|im_start|>assistant
{% endif %}
"#;
        let chat = ChatTemplate::from_source(template.into(), "t.jinja".into(), Vec::new()).unwrap();
        assert!(chat.reads("tools"));
        let tools = Arg::parse(
            r#"[{"type": "function", "function": {"name": "get_weather", "description": "Weather in a city",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}]"#,
        )
        .unwrap();
        let call = Arg::parse(
            r#"{"id": "call_1", "type": "function", "function": {"name": "get_weather",
            "arguments": {"city": "Paris"}}}"#,
        )
        .unwrap();
        let messages = [
            Message::user("Weather in Paris?"),
            Message { tool_calls: Some(vec![call]), ..Message::new("assistant", "") },
            Message { tool_call_id: Some("call_1".into()), ..Message::new("tool", "18 C") },
        ];
        assert_eq!(
            chat.render_with(&messages, true, &[("tools", tools)]).unwrap(),
            "<|im_start|>system\n# Tools\n<tools>\n{\"type\": \"function\", \"function\": {\"name\": \"get_weather\", \
             \"description\": \"Weather in a city\", \"parameters\": {\"type\": \"object\", \"properties\": \
             {\"city\": {\"type\": \"string\"}}, \"required\": [\"city\"]}}}\n</tools><|im_end|>\n\
             <|im_start|>user\nWeather in Paris?<|im_end|>\n<|im_start|>assistant\n<tool_call>\n\
             {\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<|im_end|>\n\
             <|im_start|>user\n<tool_response id=\"call_1\">\n18 C\n</tool_response><|im_end|>\n<|im_start|>assistant\n"
        );
        // Without tools, the turns alone.
        assert!(chat.render(&messages[..1], true).unwrap().starts_with("<|im_start|>user\n"));
    }

    /// `tojson` as Python's `json.dumps(ensure_ascii=False)` (expected strings from jinja2
    /// with transformers' filter).
    #[test]
    fn tojson_is_pythons() {
        let x = Arg::parse(r#"{"b": 1, "a": ["\u00e9<&>", 1.5, null, true, {}], "c": "q\"\n"}"#).unwrap();
        let render = |t: &str| {
            let chat = ChatTemplate::from_source(t.into(), "t.jinja".into(), Vec::new()).unwrap();
            chat.render_with(&[], false, &[("x", x.clone())]).unwrap()
        };
        assert_eq!(
            render("{{ x | tojson }}"),
            "{\"b\": 1, \"a\": [\"\u{e9}<&>\", 1.5, null, true, {}], \"c\": \"q\\\"\\n\"}"
        );
        assert_eq!(
            render("{{ x | tojson(indent=2) }}"),
            "{\n  \"b\": 1,\n  \"a\": [\n    \"\u{e9}<&>\",\n    1.5,\n    null,\n    true,\n    {}\n  ],\n  \"c\": \"q\\\"\\n\"\n}"
        );
        assert_eq!(
            render("{{ x | tojson(sort_keys=true) }}"),
            "{\"a\": [\"\u{e9}<&>\", 1.5, null, true, {}], \"b\": 1, \"c\": \"q\\\"\\n\"}"
        );
    }

    #[test]
    fn raise_exception_and_syntax_errors_name_the_file() {
        let t = "{% if messages[0].role != 'system' %}{{ raise_exception('Conversations must start with a system message') }}{% endif %}";
        let chat = ChatTemplate::from_source(t.into(), "m/chat_template.jinja".into(), Vec::new()).unwrap();
        let err = chat.render(&[Message::user("x")], true).unwrap_err().to_string();
        assert!(err.starts_with("m/chat_template.jinja: chat template failed: "), "{err}");
        assert!(err.contains("raise_exception: Conversations must start with a system message"), "{err}");
        assert!(!err.contains('\n'), "{err}");
        assert_eq!(chat.render(&[Message::new("system", "s")], true).unwrap(), "");

        let err = ChatTemplate::from_source("{% for %}".into(), "m/chat_template.jinja".into(), Vec::new())
            .unwrap_err()
            .to_string();
        assert!(err.starts_with("m/chat_template.jinja: chat template does not parse: "), "{err}");
        assert!(!err.contains('\n'), "{err}");
    }

    #[test]
    fn strftime_formats_utc() {
        assert_eq!(strftime("%d %b %Y", 0).unwrap(), "01 Jan 1970");
        assert_eq!(
            strftime("%Y-%m-%d %H:%M:%S %A %a %B %b %y %j %I %p %%", 1_700_000_000).unwrap(),
            "2023-11-14 22:13:20 Tuesday Tue November Nov 23 318 10 PM %"
        );
        // Leap day, last second.
        assert_eq!(
            strftime("%Y-%m-%d %H:%M:%S %A %j", 951_782_400 + 86_399).unwrap(),
            "2000-02-29 23:59:59 Tuesday 060"
        );
        assert_eq!(strftime("%Q", 0).unwrap_err(), "unsupported directive %Q");
        for days in [-800_000, -1, 0, 59, 11_016, 2_932_896] {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
        }
        // strftime_now is callable from templates and gives today's shape.
        let chat = ChatTemplate::from_source("{{ strftime_now('%d %b %Y') }}".into(), "t".into(), Vec::new()).unwrap();
        let today = chat.render(&[], true).unwrap();
        assert_eq!(today.len(), 11, "{today}");
        assert!(MONTHS.iter().any(|m| today[3..6] == m[..3]), "{today}");
    }
}
