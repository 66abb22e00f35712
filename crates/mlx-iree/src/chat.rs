//! `mlx-iree chat`: an interactive conversation with the model's chat template. Answers
//! stream to stdout through `generate`'s path (`run::answer` over the server's
//! `generator::Generator`); `/reset`, `/system TEXT` and `/exit` steer it; Ctrl-C stops an
//! answer (or, at the prompt, ends the chat); turns that no longer fit the context are
//! dropped, oldest first, with a note on stderr.

use crate::run::{ModelArgs, SamplingArgs, answer, check_model_dir};
use anyhow::{Result, bail};
use engine::scheduler::FinishReason;
use server::ModelText;
use std::io::{BufRead, IsTerminal, Write};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::mpsc;
use text::chat::Message;

#[derive(clap::Args, Debug)]
pub struct ChatArgs {
    #[command(flatten)]
    pub(crate) model: ModelArgs,
    #[command(flatten)]
    sampling: SamplingArgs,
    #[command(flatten)]
    pub(crate) draft: crate::run::DraftArgs,
    /// The system prompt to start with (as `/system TEXT` sets it).
    #[arg(long)]
    system: Option<String>,
    /// After each answer, one line on stderr: its prompt tokens (and how many of them the
    /// last turn left in the cache), tokens generated, time to the first token, decode rate.
    #[arg(long)]
    stats: bool,
}

/// Shown at the prompt when stdin is a terminal.
const PROMPT: &str = ">> ";
const HELP: &str = "/reset forgets the conversation, /system TEXT sets the system prompt (/system alone clears it), /exit or Ctrl-D quits; Ctrl-C stops an answer";

/// What the user typed, as one line.
#[derive(Debug, PartialEq, Eq)]
enum Line<'a> {
    Empty,
    Say(&'a str),
    Reset,
    Exit,
    System(Option<&'a str>),
    Unknown(&'a str),
}

fn parse(line: &str) -> Line<'_> {
    let line = line.trim();
    let Some(command) = line.strip_prefix('/') else {
        return if line.is_empty() { Line::Empty } else { Line::Say(line) };
    };
    let (name, rest) = command.split_once(char::is_whitespace).unwrap_or((command, ""));
    let rest = rest.trim();
    match name {
        "reset" if rest.is_empty() => Line::Reset,
        "exit" | "quit" if rest.is_empty() => Line::Exit,
        "system" => Line::System((!rest.is_empty()).then_some(rest)),
        _ => Line::Unknown(line),
    }
}

/// The history: the system prompt and the finished turns (user text, answer text).
#[derive(Debug, Default)]
struct Conversation {
    system: Option<String>,
    turns: Vec<(String, String)>,
}

/// A prompt that fits, and how many old turns were dropped for it.
#[derive(Debug)]
struct Fitted {
    ids: Vec<u32>,
    dropped: usize,
}

impl Conversation {
    /// The messages of the history from turn `first` on, followed by `next` from the user.
    fn messages(&self, first: usize, next: &str) -> Vec<Message> {
        let mut messages: Vec<Message> = self.system.iter().map(|s| Message::new("system", s.as_str())).collect();
        for (user, assistant) in &self.turns[first..] {
            messages.push(Message::user(user.as_str()));
            messages.push(Message::new("assistant", assistant.as_str()));
        }
        messages.push(Message::user(next));
        messages
    }

    /// The prompt ids for `next`, at most `room` of them: the oldest turns are dropped
    /// from the history until it fits. A message that does not fit even alone (with the
    /// system prompt) is an error, and the history is left as it was.
    fn fit(&mut self, next: &str, room: usize, encode: impl Fn(&[Message]) -> Result<Vec<u32>>) -> Result<Fitted> {
        let mut alone = 0;
        for dropped in 0..=self.turns.len() {
            let ids = encode(&self.messages(dropped, next))?;
            if ids.len() <= room {
                self.turns.drain(..dropped);
                return Ok(Fitted { ids, dropped });
            }
            alone = ids.len();
        }
        bail!(
            "this message takes {alone} tokens with the chat template, more than the {room} the context leaves for a prompt; say it shorter"
        )
    }
}

/// What the input thread and the Ctrl-C listener tell the chat loop.
#[derive(Debug)]
enum Input {
    Line(String),
    Eof,
    Failed(std::io::Error),
    Interrupt,
}

/// Reads stdin line by line on a thread of its own, so the chat loop can wait for a line
/// and for Ctrl-C at once.
fn read_lines(tx: mpsc::Sender<Input>) -> Result<()> {
    std::thread::Builder::new().name("stdin".into()).spawn(move || {
        let stdin = std::io::stdin();
        let mut lock = stdin.lock();
        loop {
            let mut line = String::new();
            let input = match lock.read_line(&mut line) {
                Ok(0) => Input::Eof,
                Ok(_) => Input::Line(line),
                Err(e) => Input::Failed(e),
            };
            let last = !matches!(input, Input::Line(_));
            if tx.send(input).is_err() || last {
                return;
            }
        }
    })?;
    Ok(())
}

/// From here on SIGINT no longer ends the process: each one is counted (an answer in
/// progress stops when the count moves) and reported to the chat loop (which ends the chat
/// when it comes at the prompt).
fn count_interrupts(tx: mpsc::Sender<Input>) -> Result<Arc<AtomicU64>> {
    let runtime = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    let mut signals = {
        let _context = runtime.enter();
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::interrupt())?
    };
    let count = Arc::new(AtomicU64::new(0));
    let counted = Arc::clone(&count);
    std::thread::Builder::new().name("sigint".into()).spawn(move || {
        runtime.block_on(async move {
            while signals.recv().await.is_some() {
                counted.fetch_add(1, Ordering::SeqCst);
                if tx.send(Input::Interrupt).is_err() {
                    return;
                }
            }
        });
    })?;
    Ok(count)
}

pub fn run(args: &ChatArgs) -> Result<()> {
    let dir = &args.model.model;
    let config = check_model_dir(dir)?;
    args.model.check_draft(&config)?;
    args.sampling.check()?;
    let text = ModelText::load(dir)?;
    args.sampling.check_vocab(text.tokenizer.vocab_size())?;
    // A model without a chat template cannot chat, nor one whose template has no reasoning
    // effort be given one: said before anything is loaded.
    if let Err(e) = &text.chat {
        bail!("{e}");
    }
    let effort = args.sampling.effort(&text)?;
    let plan = args.model.plan(&config, 1, 2, "a one-token message and its answer")?;
    let context = plan.cache.positions;
    // Room kept for the answer: `--max-tokens`, but at most a quarter of the context (an
    // answer longer than that ends when the context is full).
    let room = context - args.sampling.max_tokens.min(context / 4);
    let generator = crate::run::start(&args.model, text)?;

    let (tx, inputs) = mpsc::channel();
    let interrupts = count_interrupts(tx.clone())?;
    read_lines(tx)?;
    let tty = std::io::stdin().is_terminal();
    let system = args.system.as_deref().map(str::trim).filter(|s| !s.is_empty()).map(str::to_owned);
    let mut conversation = Conversation { system, turns: Vec::new() };
    let mut stdout = std::io::stdout();
    eprintln!("chat: {} ({context} positions); {HELP}", dir.display());
    loop {
        let seen = interrupts.load(Ordering::SeqCst);
        if tty {
            write!(stdout, "{PROMPT}")?;
            stdout.flush()?;
        }
        let line = loop {
            match inputs.recv() {
                Ok(Input::Line(line)) => break line,
                // One sent while an answer ran, already acted on.
                Ok(Input::Interrupt) if interrupts.load(Ordering::SeqCst) == seen => {}
                Ok(Input::Interrupt | Input::Eof) | Err(_) => {
                    if tty {
                        writeln!(stdout)?;
                    }
                    return Ok(());
                }
                Ok(Input::Failed(e)) => bail!("reading stdin: {e}"),
            }
        };
        let text = match parse(&line) {
            Line::Empty => continue,
            Line::Exit => return Ok(()),
            Line::Reset => {
                conversation.turns.clear();
                eprintln!("chat: the conversation is forgotten");
                continue;
            }
            Line::System(system) => {
                conversation.system = system.map(str::to_owned);
                eprintln!("chat: system prompt {}", if system.is_some() { "set" } else { "cleared" });
                continue;
            }
            Line::Unknown(command) => {
                eprintln!("chat: unknown command `{command}`; {HELP}");
                continue;
            }
            Line::Say(text) => text,
        };
        let encode = |messages: &[Message]| Ok(generator.encode_chat(messages, effort)?);
        let fitted = match conversation.fit(text, room, encode) {
            Ok(fitted) => fitted,
            Err(e) => {
                // The user's message (or the template's refusal of it): say why, keep chatting.
                eprintln!("chat: {}", format!("{e:#}").replace('\n', " "));
                continue;
            }
        };
        if fitted.dropped > 0 {
            eprintln!(
                "chat: the context ({context} positions) is full: dropped the oldest {} turn{} of the conversation",
                fitted.dropped,
                if fitted.dropped == 1 { "" } else { "s" }
            );
        }
        let stop = || interrupts.load(Ordering::SeqCst) != seen;
        let answer =
            answer(&generator, fitted.ids, &args.sampling, true, (&mut stdout, &mut std::io::stderr()), &stop)?;
        match answer.done.reason {
            FinishReason::Cancelled => eprintln!("chat: answer stopped (Ctrl-C); kept as far as it got"),
            FinishReason::ContextFull => eprintln!("chat: the answer filled the context ({context} positions)"),
            FinishReason::Stop | FinishReason::Length => {}
        }
        if args.stats {
            let d = &answer.done;
            let decode = d.generated.saturating_sub(1) as f64 / d.decode_seconds.max(1e-9);
            eprintln!(
                "chat: prompt {} tokens ({} from the cache), {} generated, first token in {:.0} ms, decode {:.1} tok/s{}",
                d.prompt_tokens,
                d.cached_tokens,
                d.generated,
                d.prefill_seconds * 1e3,
                if d.generated > 1 { decode } else { 0.0 },
                crate::run::draft_summary(d, args.model.draft != engine::Draft::Off)
            );
        }
        conversation.turns.push((text.to_owned(), answer.text));
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // a test that cannot unwrap has failed
mod tests {
    use super::*;

    #[test]
    fn lines_are_messages_or_commands() {
        assert_eq!(parse("  hello there \n"), Line::Say("hello there"));
        assert_eq!(parse(" \n"), Line::Empty);
        assert_eq!(parse("/reset\n"), Line::Reset);
        assert_eq!(parse("/exit"), Line::Exit);
        assert_eq!(parse("/system  Be brief. \n"), Line::System(Some("Be brief.")));
        assert_eq!(parse("/system"), Line::System(None));
        assert_eq!(parse("/reset now"), Line::Unknown("/reset now"));
        assert_eq!(parse("/help"), Line::Unknown("/help"));
    }

    /// One token per word of every message, plus 2 per message (a stand-in template).
    fn words(messages: &[Message]) -> Result<Vec<u32>> {
        Ok(messages.iter().flat_map(|m| std::iter::repeat_n(0, 2 + m.content.split_whitespace().count())).collect())
    }

    #[test]
    fn the_oldest_turns_are_dropped_until_the_prompt_fits() {
        let mut c = Conversation { system: Some("be kind".into()), turns: Vec::new() };
        for i in 0..3 {
            c.turns.push((format!("question {i}"), format!("answer {i} a b")));
        }
        // The system prompt 4, each turn 4 + 6, the next message 5: 4 + 30 + 5 = 39.
        let fitted = c.fit("one two three", 39, words).unwrap();
        assert_eq!((fitted.ids.len(), fitted.dropped, c.turns.len()), (39, 0, 3));
        let fitted = c.fit("one two three", 38, words).unwrap();
        assert_eq!((fitted.ids.len(), fitted.dropped), (29, 1));
        assert_eq!(c.turns[0].0, "question 1");
        let fitted = c.fit("one two three", 9, words).unwrap();
        assert_eq!((fitted.ids.len(), fitted.dropped, c.turns.len()), (9, 2, 0));
        c.system = None;
        assert_eq!(c.messages(0, "hi"), vec![Message::user("hi")]);
    }

    #[test]
    fn a_message_too_long_alone_leaves_the_history_as_it_was() {
        let mut c = Conversation { system: None, turns: vec![("q".into(), "a".into())] };
        let err = c.fit("a b c d e f", 7, words).unwrap_err().to_string();
        assert!(err.starts_with("this message takes 8 tokens"), "{err}");
        assert_eq!(c.turns, vec![("q".to_owned(), "a".to_owned())]);
    }
}
