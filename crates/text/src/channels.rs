//! A generated answer split into the model's reasoning and its answer proper, each streamed
//! as text ([`ChannelDecoder`]).
//!
//! gpt-oss writes in OpenAI's harmony format: every message is `<|start|>` + a header +
//! `<|message|>` + its text + `<|end|>` (the last one `<|return|>`, or `<|call|>` for a tool
//! call), its header naming the role and, after `<|channel|>`, the channel: `analysis` (the
//! reasoning), `final` (the answer), `commentary` (tool calls and preambles). Its chat
//! template ends the prompt with `<|start|>assistant`, so an answer starts with a header,
//! e.g. `<|channel|>analysis<|message|>...<|end|><|start|>assistant<|channel|>final<|message|>
//! ...<|return|>`. Those markers are special tokens, which the detokenizer leaves out, so the
//! split is made on the token ids: headers are read whole, and each message's text goes to
//! its channel's own streaming decoder. `analysis` is reasoning; every other channel is
//! answer text. A model that writes without headers gets all of its text as answer.
//!
//! Where a request offered tools ([`ChannelDecoder::tool_calls`]), each call comes whole as
//! [`Channel::Tool`] text for [`crate::tools::ToolFormat::parse`]: in harmony, a message
//! addressed `to=functions.NAME` (its recipient on the first line, then its text); in the
//! plain formats, the ids between the format's marker tokens.

use crate::stream::StreamDecoder;
use crate::tokenizer::{Tokenizer, TokenizerError};
use crate::tools::ToolMarkers;

/// Where a piece of generated text belongs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    /// The answer proper (`content` in an OpenAI response).
    Content,
    /// The model's reasoning before it (`reasoning`, as vLLM and mlx-lm's server name it).
    Reasoning,
    /// One whole tool call's text, given when the call ends (empty while it is read).
    Tool,
}

/// The harmony format's marker tokens in a vocabulary.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Harmony {
    start: u32,
    channel: u32,
    message: u32,
    /// `<|end|>`, `<|return|>`, `<|call|>`: the ends of a message.
    ends: [u32; 3],
}

impl Harmony {
    /// `<|channel|>`, `<|message|>` and `<|call|>`: the tokens around a tool call.
    pub fn call_ids(&self) -> [u32; 3] {
        [self.channel, self.message, self.ends[2]]
    }

    /// The format's tokens, where the tokenizer has every one of them (gpt-oss's o200k_harmony).
    pub fn of(tokenizer: &Tokenizer) -> Option<Harmony> {
        let id = |t: &str| tokenizer.token_to_id(t);
        Some(Harmony {
            start: id("<|start|>")?,
            channel: id("<|channel|>")?,
            message: id("<|message|>")?,
            ends: [id("<|end|>")?, id("<|return|>")?, id("<|call|>")?],
        })
    }
}

#[derive(Debug, Clone)]
enum State {
    /// Between messages: the header's ids so far (empty: none yet).
    Header(Vec<u32>),
    /// Inside a message of this channel (content or reasoning).
    Body(Channel),
    /// Inside a tool call: its recipient (harmony's; empty in the plain formats) and its ids
    /// so far.
    Tool { recipient: String, ids: Vec<u32> },
}

/// Streaming detokenizer for one answer, by channel. Without a format it is one
/// [`StreamDecoder`] whose text is all [`Channel::Content`].
#[derive(Debug, Clone)]
pub struct ChannelDecoder {
    harmony: Option<Harmony>,
    /// Whether tool calls are read apart ([`ChannelDecoder::tool_calls`]).
    calls: bool,
    /// The plain formats' call markers (with `calls`).
    markers: Option<ToolMarkers>,
    state: State,
    content: StreamDecoder,
    reasoning: StreamDecoder,
}

impl ChannelDecoder {
    /// A decoder that gives every token's text as [`Channel::Content`] (special tokens left out).
    pub fn plain() -> ChannelDecoder {
        ChannelDecoder {
            harmony: None,
            calls: false,
            markers: None,
            state: State::Body(Channel::Content),
            content: StreamDecoder::new(true),
            reasoning: StreamDecoder::new(true),
        }
    }

    /// A decoder for an answer in the harmony format, starting where its chat template's
    /// prompt ends (before a header).
    pub fn harmony(harmony: Harmony) -> ChannelDecoder {
        ChannelDecoder { harmony: Some(harmony), state: State::Header(Vec::new()), ..ChannelDecoder::plain() }
    }

    /// Reads tool calls apart as [`Channel::Tool`] text: harmony's messages to a recipient,
    /// or, in a plain format, what its `markers` enclose.
    pub fn tool_calls(self, markers: Option<ToolMarkers>) -> ChannelDecoder {
        ChannelDecoder { calls: true, markers, ..self }
    }

    fn decoder(&mut self, channel: Channel) -> &mut StreamDecoder {
        match channel {
            Channel::Reasoning => &mut self.reasoning,
            Channel::Content | Channel::Tool => &mut self.content,
        }
    }

    /// The ids of a tool call whose `end` (or the next call's start) came, as its text.
    fn tool_text(tokenizer: &Tokenizer, recipient: &str, ids: &[u32]) -> Result<String, TokenizerError> {
        let body = tokenizer.decode(ids, true)?;
        Ok(if recipient.is_empty() { body } else { format!("{recipient}\n{body}") })
    }

    /// Adds one token; returns the text it completes (possibly empty) and its channel.
    pub fn push(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<(Channel, String), TokenizerError> {
        if let Some(m) = self.markers {
            match &mut self.state {
                State::Body(Channel::Content) if id == m.start => {
                    let text = self.content.finish(tokenizer)?;
                    self.state = State::Tool { recipient: String::new(), ids: Vec::new() };
                    return Ok((Channel::Content, text));
                }
                // A call ends at its end marker, or (a format without one) where the next starts.
                State::Tool { recipient, ids } if Some(id) == m.end || (m.end.is_none() && id == m.start) => {
                    let text = Self::tool_text(tokenizer, recipient, ids)?;
                    self.state = if id == m.start {
                        State::Tool { recipient: String::new(), ids: Vec::new() }
                    } else {
                        State::Body(Channel::Content)
                    };
                    return Ok((Channel::Tool, text));
                }
                _ => {}
            }
        }
        let Some(h) = self.harmony else {
            if let State::Tool { ids, .. } = &mut self.state {
                ids.push(id);
                return Ok((Channel::Tool, String::new()));
            }
            return Ok((Channel::Content, self.content.push(tokenizer, id)?));
        };
        match &mut self.state {
            State::Header(ids) if id == h.message => {
                let header = tokenizer.decode(ids, false)?;
                match recipient_of(&header) {
                    Some(recipient) if self.calls => {
                        self.state = State::Tool { recipient: recipient.to_owned(), ids: Vec::new() };
                        Ok((Channel::Tool, String::new()))
                    }
                    _ => {
                        let channel = channel_of(&header);
                        self.state = State::Body(channel);
                        Ok((channel, String::new()))
                    }
                }
            }
            // A header starts with `<|start|>` or `<|channel|>`; anything else where one was
            // due is text without a header: the answer's.
            State::Header(ids) if ids.is_empty() && id != h.start && id != h.channel => {
                self.state = State::Body(Channel::Content);
                Ok((Channel::Content, self.content.push(tokenizer, id)?))
            }
            State::Header(ids) => {
                ids.push(id);
                Ok((Channel::Content, String::new()))
            }
            State::Tool { recipient, ids } if h.ends.contains(&id) => {
                let text = Self::tool_text(tokenizer, recipient, ids)?;
                self.state = State::Header(Vec::new());
                Ok((Channel::Tool, text))
            }
            State::Tool { ids, .. } => {
                ids.push(id);
                Ok((Channel::Tool, String::new()))
            }
            State::Body(channel) if h.ends.contains(&id) => {
                let channel = *channel;
                self.state = State::Header(Vec::new());
                Ok((channel, self.decoder(channel).finish(tokenizer)?))
            }
            State::Body(channel) => {
                let channel = *channel;
                Ok((channel, self.decoder(channel).push(tokenizer, id)?))
            }
        }
    }

    /// Text still held back at the end (an incomplete character; a header never closed, as
    /// answer text).
    pub fn finish(&mut self, tokenizer: &Tokenizer) -> Result<(Channel, String), TokenizerError> {
        match std::mem::replace(&mut self.state, State::Header(Vec::new())) {
            State::Body(channel) => Ok((channel, self.decoder(channel).finish(tokenizer)?)),
            State::Header(ids) => Ok((Channel::Content, tokenizer.decode(&ids, true)?)),
            State::Tool { recipient, ids } => Ok((Channel::Tool, Self::tool_text(tokenizer, &recipient, &ids)?)),
        }
    }
}

/// The recipient a harmony header addresses (`... to=functions.get_weather <|constrain|>json`):
/// a tool call.
fn recipient_of(header: &str) -> Option<&str> {
    let (_, rest) = header.split_once("to=")?;
    let name = rest.split(|c: char| c.is_whitespace() || c == '<').next().unwrap_or_default();
    (!name.is_empty()).then_some(name)
}

/// The channel a harmony header names (`assistant<|channel|>analysis`, `<|channel|>commentary
/// to=functions.f <|constrain|>json`): `analysis` is reasoning, anything else the answer.
fn channel_of(header: &str) -> Channel {
    let name = header.split_once("<|channel|>").map_or("", |(_, rest)| rest.trim_start());
    let name = name.split(|c: char| c.is_whitespace() || c == '<').next().unwrap_or_default();
    if name == "analysis" { Channel::Reasoning } else { Channel::Content }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tokenizer::test_model::dir;

    const MARKERS: [&str; 6] = ["<|start|>", "<|channel|>", "<|message|>", "<|end|>", "<|return|>", "<|call|>"];

    /// SmolLM2's tokenizer with `markers` added (ids from 49152), special or not.
    fn tokenizer_with(tmp: &std::path::Path, markers: &[&str], special: bool) -> Tokenizer {
        let text = std::fs::read_to_string(dir().join("tokenizer.json")).unwrap();
        let mut json: serde_json::Value = serde_json::from_str(&text).unwrap();
        let added = json["added_tokens"].as_array_mut().unwrap();
        for (i, marker) in markers.iter().enumerate() {
            added.push(serde_json::json!({
                "id": 49152 + i, "content": marker, "single_word": false, "lstrip": false,
                "rstrip": false, "normalized": false, "special": special
            }));
        }
        let path = tmp.join("tokenizer.json");
        std::fs::write(&path, json.to_string()).unwrap();
        Tokenizer::from_file(&path).unwrap()
    }

    /// SmolLM2's tokenizer with harmony's markers added as special tokens (ids from 49152).
    fn harmony_tokenizer(tmp: &std::path::Path) -> Tokenizer {
        tokenizer_with(tmp, &MARKERS, true)
    }

    /// Streams `text`'s ids one at a time: each channel's text, joined, and each tool call's.
    fn split_calls(tok: &Tokenizer, dec: &mut ChannelDecoder, text: &str) -> (String, String, Vec<String>) {
        let (mut content, mut reasoning, mut calls) = (String::new(), String::new(), Vec::new());
        let ids = tok.encode(text, false).unwrap();
        let mut pieces: Vec<(Channel, String)> = ids.iter().map(|&id| dec.push(tok, id).unwrap()).collect();
        pieces.push(dec.finish(tok).unwrap());
        for (channel, piece) in pieces {
            match channel {
                Channel::Content => content.push_str(&piece),
                Channel::Reasoning => reasoning.push_str(&piece),
                Channel::Tool if piece.is_empty() => {}
                Channel::Tool => calls.push(piece),
            }
        }
        (content, reasoning, calls)
    }

    /// [`split_calls`] of an answer without tool calls.
    fn split(tok: &Tokenizer, dec: &mut ChannelDecoder, text: &str) -> (String, String) {
        let (content, reasoning, calls) = split_calls(tok, dec, text);
        assert_eq!(calls, Vec::<String>::new());
        (content, reasoning)
    }

    #[test]
    fn harmony_answers_split_into_reasoning_and_content() {
        let tmp = tempfile::tempdir().unwrap();
        let tok = harmony_tokenizer(tmp.path());
        let h = Harmony::of(&tok).unwrap();
        assert_eq!(h.channel, 49153);
        let answer = "<|channel|>analysis<|message|>The user asks for France's capital. Easy.<|end|>\
                      <|start|>assistant<|channel|>final<|message|>The capital of France is Paris.<|return|>";
        let (content, reasoning) = split(&tok, &mut ChannelDecoder::harmony(h), answer);
        assert_eq!(reasoning, "The user asks for France's capital. Easy.");
        assert_eq!(content, "The capital of France is Paris.");
        // Without the split, the markers' neighbours run together (what this replaces).
        let (all, none) = split(&tok, &mut ChannelDecoder::plain(), answer);
        assert_eq!(none, "");
        assert!(all.starts_with("analysisThe user asks"), "{all}");
    }

    #[test]
    fn commentary_is_content_and_headerless_text_is_content() {
        let tmp = tempfile::tempdir().unwrap();
        let tok = harmony_tokenizer(tmp.path());
        let h = Harmony::of(&tok).unwrap();
        let answer =
            "<|channel|>commentary to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>";
        assert_eq!(split(&tok, &mut ChannelDecoder::harmony(h), answer), ("{\"city\": \"Paris\"}".into(), "".into()));
        // A prompt that already opened the final message: its text is the answer.
        let (content, reasoning) = split(&tok, &mut ChannelDecoder::harmony(h), "Paris, of course.<|return|>");
        assert_eq!((content.as_str(), reasoning.as_str()), ("Paris, of course.", ""));
        // Cut off inside a header: what it held, as text.
        let (content, _) = split(&tok, &mut ChannelDecoder::harmony(h), "<|channel|>analysis");
        assert_eq!(content, "analysis");
    }

    #[test]
    fn harmony_tool_calls_come_whole_with_their_recipient() {
        let tmp = tempfile::tempdir().unwrap();
        let tok = harmony_tokenizer(tmp.path());
        let h = Harmony::of(&tok).unwrap();
        let answer = "<|channel|>analysis<|message|>Need the weather.<|end|><|start|>assistant<|channel|>commentary \
                      to=functions.get_weather <|constrain|>json<|message|>{\"city\": \"Paris\"}<|call|>";
        let (content, reasoning, calls) = split_calls(&tok, &mut ChannelDecoder::harmony(h).tool_calls(None), answer);
        assert_eq!((content.as_str(), reasoning.as_str()), ("", "Need the weather."));
        assert_eq!(calls, ["functions.get_weather\n{\"city\": \"Paris\"}"]);
        // The recipient may come before the channel; a call cut short comes at the end.
        let answer = "<|start|>assistant to=functions.f<|channel|>commentary json<|message|>{\"a\": 1";
        let (_, _, calls) = split_calls(&tok, &mut ChannelDecoder::harmony(h).tool_calls(None), answer);
        assert_eq!(calls, ["functions.f\n{\"a\": 1"]);
    }

    /// A forced harmony call (`tool_choice` `required`): the grammar writes a commentary
    /// message to the tool with JSON arguments, which this decoder reads as the call.
    #[test]
    fn a_forced_harmony_call_reads_as_a_call() {
        use crate::constraint::Grammars;
        use crate::tools::ToolFormat;
        let tmp = tempfile::tempdir().unwrap();
        let tok = harmony_tokenizer(tmp.path());
        let h = Harmony::of(&tok).unwrap();
        let eos = tok.token_to_id("<|return|>").unwrap();
        let tools = [serde_json::json!({"type": "function", "function": {"name": "get_time", "parameters": {
            "type": "object", "properties": {"zone": {"enum": ["UTC", "CET"]}}, "required": ["zone"],
            "additionalProperties": false}}})];
        let grammar = ToolFormat::Harmony.forced_call(None, Some(h.call_ids()), &tools, None).unwrap();
        let mut c = Grammars::new(&tok, eos).unwrap().lark(&grammar).unwrap();
        let mut dec = ChannelDecoder::harmony(h).tool_calls(None);
        let mut calls = Vec::new();
        for _ in 0..48 {
            // The lowest id the grammar allows: it alone decides what is written.
            let mut logits: Vec<f32> = (0..tok.vocab_size()).map(|i| -(i as f32)).collect();
            c.mask(&mut logits).unwrap();
            let id = (0..logits.len()).max_by(|&a, &b| logits[a].total_cmp(&logits[b])).unwrap() as u32;
            c.accept(id).unwrap();
            if id == eos {
                break;
            }
            if let (Channel::Tool, text) = dec.push(&tok, id).unwrap()
                && !text.is_empty()
            {
                calls.push(text);
            }
        }
        assert_eq!(calls.len(), 1, "{calls:?}");
        let parsed = ToolFormat::Harmony.parse(&calls[0], &tools).unwrap();
        assert_eq!(parsed[0].name, "get_time");
        assert!(["UTC", "CET"].iter().any(|z| parsed[0].arguments["zone"] == *z), "{calls:?}");
    }

    #[test]
    fn plain_tool_calls_are_what_the_markers_enclose() {
        let tmp = tempfile::tempdir().unwrap();
        // Qwen's markers are not special tokens; Mistral's is, and has no end marker.
        let tok = tokenizer_with(tmp.path(), &["<tool_call>", "</tool_call>", "[TOOL_CALLS]"], false);
        let markers = ToolMarkers { start: 49152, end: Some(49153) };
        let answer = "Let me look.<tool_call>\n{\"name\": \"f\", \"arguments\": {}}\n</tool_call>\
                      <tool_call>{\"name\": \"g\"}</tool_call>Done.";
        let mut dec = ChannelDecoder::plain().tool_calls(Some(markers));
        let (content, _, calls) = split_calls(&tok, &mut dec, answer);
        assert_eq!(content, "Let me look.Done.");
        assert_eq!(calls, ["\n{\"name\": \"f\", \"arguments\": {}}\n", "{\"name\": \"g\"}"]);
        // Without the split, the markers are text like any other.
        let (content, _) = split(&tok, &mut ChannelDecoder::plain(), "a<tool_call>b");
        assert_eq!(content, "a<tool_call>b");
        let mistral = ToolMarkers { start: 49154, end: None };
        let mut dec = ChannelDecoder::plain().tool_calls(Some(mistral));
        let (content, _, calls) = split_calls(&tok, &mut dec, "[TOOL_CALLS]f[ARGS]{}[TOOL_CALLS]g[ARGS]{}");
        assert_eq!((content.as_str(), calls), ("", vec!["f[ARGS]{}".to_owned(), "g[ARGS]{}".to_owned()]));
    }

    #[test]
    fn the_format_is_found_only_where_every_marker_is() {
        let tok = Tokenizer::from_dir(&dir()).unwrap();
        assert_eq!(Harmony::of(&tok), None, "SmolLM2 has none of them");
        assert_eq!(channel_of("assistant<|channel|>analysis"), Channel::Reasoning);
        assert_eq!(channel_of("<|channel|>final"), Channel::Content);
        assert_eq!(channel_of("<|channel|> analysis"), Channel::Reasoning, "a decoder that joins with spaces");
        assert_eq!(channel_of("assistant"), Channel::Content);
        assert_eq!(recipient_of("<|channel|>commentary to=functions.f <|constrain|>json"), Some("functions.f"));
        assert_eq!(recipient_of("<|channel|>final"), None);
    }
}
