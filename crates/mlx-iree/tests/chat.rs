//! `mlx-iree chat` driven through a pseudo-terminal, as a person at a terminal drives it:
//! greedy answers equal what `mlx-iree generate` prints for the same templated
//! conversation, `/reset` forgets it, `/system` sets the system prompt, Ctrl-C stops an
//! answer (kept as far as it got) and the prompt returns, a conversation past the context
//! drops its oldest turns, and `/exit`, Ctrl-C or Ctrl-D at the prompt end it with status 0.
//! Model and shapes are smollm2.rs's `generate` test's (one compiled module for both). A
//! harmony model (gpt-oss's format, scripted) gives its reasoning on stderr and its answer
//! alone on stdout.

#![allow(clippy::unwrap_used)] // a test that cannot unwrap has failed; helpers included

mod common;

use common::{SMOLLM2_CONTEXT, mlx_iree, smollm2};
use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};
use text::chat::{ChatTemplate, Message};

/// Long enough that Ctrl-C lands while an answer is still decoding.
const MAX_TOKENS: &str = "48";
/// The longest any one step may take (the first also loads the model, compiled on a cold
/// cache).
const LOAD_DEADLINE: Duration = Duration::from_secs(900);
const STEP_DEADLINE: Duration = Duration::from_secs(120);

fn generate(prompt: &str, chat: bool) -> String {
    common::generate(prompt, chat, MAX_TOKENS)
}

/// `generate`'s answer for a whole conversation: the template rendered here and given as a
/// plain prompt (SmolLM2's tokenizer adds no special tokens of its own, checked here, so the
/// ids are those chat feeds the model).
fn generate_conversation(messages: &[Message]) -> String {
    let template = ChatTemplate::from_dir(&smollm2()).unwrap();
    let tokenizer = text::tokenizer::Tokenizer::from_dir(&smollm2()).unwrap();
    let rendered = template.render(messages, true).unwrap();
    assert_eq!(tokenizer.encode(&rendered, true).unwrap(), template.encode(&tokenizer, messages).unwrap());
    generate(&rendered, false)
}

/// A child process on the slave side of a pseudo-terminal (its controlling terminal, so
/// Ctrl-C written to the master is SIGINT to it), stderr in a file; killed when dropped.
struct Terminal {
    child: Child,
    master: File,
    output: mpsc::Receiver<Vec<u8>>,
    /// Everything the terminal showed, `\r\n` as `\n`.
    shown: String,
    stderr: PathBuf,
    _dir: tempfile::TempDir,
}

impl Drop for Terminal {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Terminal {
    fn spawn(mut command: Command) -> Terminal {
        let (mut master, mut slave) = (-1, -1);
        // SAFETY: both pointers are to live ints; name, termios and window size may be null.
        let rc = unsafe {
            libc::openpty(&raw mut master, &raw mut slave, std::ptr::null_mut(), std::ptr::null(), std::ptr::null())
        };
        assert_eq!(rc, 0, "openpty: {}", std::io::Error::last_os_error());
        // SAFETY: openpty opened both descriptors, and nothing else owns them.
        let (master, slave) = unsafe { (OwnedFd::from_raw_fd(master), OwnedFd::from_raw_fd(slave)) };
        let fd = slave.as_raw_fd();
        // SAFETY: a zeroed termios is a valid value for tcgetattr to overwrite.
        let mut termios: libc::termios = unsafe { std::mem::zeroed() };
        // SAFETY: `fd` is an open terminal and `termios` is writable.
        let rc = unsafe { libc::tcgetattr(fd, &raw mut termios) };
        assert_eq!(rc, 0, "tcgetattr: {}", std::io::Error::last_os_error());
        // Ctrl-C must not flush output the test has not read yet (the answer so far).
        termios.c_lflag |= libc::NOFLSH;
        // SAFETY: `fd` is an open terminal; `termios` holds its attributes with one flag more.
        let rc = unsafe { libc::tcsetattr(fd, libc::TCSANOW, &raw const termios) };
        assert_eq!(rc, 0, "tcsetattr: {}", std::io::Error::last_os_error());
        let dir = tempfile::tempdir().unwrap();
        let stderr = dir.path().join("stderr");
        let slave = File::from(slave);
        command.stdin(slave.try_clone().unwrap()).stdout(slave).stderr(File::create(&stderr).unwrap());
        // SAFETY: the closure runs in the child between fork and exec and calls only setsid
        // and ioctl, both async-signal-safe: a new session whose controlling terminal is the
        // pty on stdin.
        unsafe {
            command.pre_exec(|| {
                if libc::setsid() < 0 || libc::ioctl(0, libc::TIOCSCTTY, 0) < 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let child = command.spawn().unwrap();
        // The parent's copies of the slave go with `command`: the master then reads EIO
        // once the child is gone.
        drop(command);
        let master = File::from(master);
        let mut reader = master.try_clone().unwrap();
        let (tx, output) = mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            while let Ok(n) = reader.read(&mut buf) {
                if n == 0 || tx.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        Terminal { child, master, output, shown: String::new(), stderr, _dir: dir }
    }

    /// Reads what the terminal shows until `done(shown)`, failing after `deadline`.
    fn wait_for(&mut self, what: &str, deadline: Duration, done: impl Fn(&str) -> bool) {
        let end = Instant::now() + deadline;
        let mut bytes = Vec::new();
        while !done(&self.shown) {
            let left = end.saturating_duration_since(Instant::now());
            match self.output.recv_timeout(left) {
                Ok(chunk) => {
                    bytes.extend(chunk);
                    // Whole characters only; a split one waits for its other bytes.
                    let valid = match std::str::from_utf8(&bytes) {
                        Ok(_) => bytes.len(),
                        Err(e) => e.valid_up_to(),
                    };
                    self.shown += &std::str::from_utf8(&bytes[..valid]).unwrap().replace("\r\n", "\n");
                    bytes.drain(..valid);
                }
                Err(e) => {
                    panic!("waiting for {what} ({e:?}):\nterminal:\n{}\nstderr:\n{}", self.shown, self.stderr_text())
                }
            }
        }
    }

    fn type_keys(&mut self, keys: &str) {
        self.master.write_all(keys.as_bytes()).unwrap();
    }

    /// Types `line` and Enter, waits for the next prompt and returns what was shown between
    /// the echoed line and that prompt, without the final newline.
    fn say(&mut self, line: &str) -> String {
        let start = self.shown.len();
        self.type_keys(&format!("{line}\n"));
        let echo = format!("{line}\n");
        self.wait_for(&format!("the answer to `{line}`"), STEP_DEADLINE, |shown| {
            shown[start..].starts_with(&echo) && shown.ends_with("\n>> ")
        });
        shown_since(&self.shown[start + echo.len()..])
    }

    fn stderr_text(&self) -> String {
        std::fs::read_to_string(&self.stderr).unwrap_or_default()
    }

    /// The exit status, waiting at most `deadline`.
    fn exit_status(&mut self, deadline: Duration) -> std::process::ExitStatus {
        let end = Instant::now() + deadline;
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return status;
            }
            assert!(Instant::now() < end, "chat did not exit:\n{}\nstderr:\n{}", self.shown, self.stderr_text());
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

/// What the terminal showed before the prompt at the end of `shown`, without the newline
/// that ends an answer.
fn shown_since(shown: &str) -> String {
    let before = shown.strip_suffix(">> ").unwrap();
    before.strip_suffix('\n').unwrap_or(before).to_owned()
}

/// `mlx-iree chat` on SmolLM2 in a terminal, at its first prompt.
fn chat() -> Terminal {
    let mut command = mlx_iree();
    command.args(["chat", "--stats", "--max-context", SMOLLM2_CONTEXT, "--max-tokens", MAX_TOKENS]);
    command.arg("--model").arg(smollm2());
    let mut terminal = Terminal::spawn(command);
    terminal.wait_for("the first prompt", LOAD_DEADLINE, |shown| shown == ">> ");
    terminal
}

fn user(text: &str) -> Message {
    Message::user(text)
}

fn assistant(text: &str) -> Message {
    Message::new("assistant", text)
}

#[test]
fn a_conversation_in_a_terminal() {
    let mut t = chat();
    let q1 = "What is the capital of France?";
    let q2 = "And of Germany?";

    // Two turns: the second answers with the first in its prompt, which it reads from the
    // cache its first turn left (the prefix cache): only its new tokens are prefilled.
    let a1 = t.say(q1);
    assert_eq!(a1, generate(q1, true));
    assert!(a1.contains("Paris"), "{a1}");
    let a2 = t.say(q2);
    assert_eq!(a2, generate_conversation(&[user(q1), assistant(&a1), user(q2)]));
    let turns: Vec<(usize, usize)> = t
        .stderr_text()
        .lines()
        .filter_map(|l| l.strip_prefix("chat: prompt "))
        .map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            (words[0].parse().unwrap(), words[2].trim_start_matches('(').parse().unwrap())
        })
        .collect();
    assert_eq!(turns.len(), 2, "{}", t.stderr_text());
    assert_eq!(turns[0].1, 0);
    let first = ChatTemplate::from_dir(&smollm2()).unwrap();
    let tok = text::tokenizer::Tokenizer::from_dir(&smollm2()).unwrap();
    let first_prompt = first.encode(&tok, &[user(q1)]).unwrap().len();
    assert!(turns[1].1 >= first_prompt && turns[1].1 < turns[1].0, "{turns:?}: the first prompt is {first_prompt}");

    // After /reset the same question is asked of an empty conversation.
    assert_eq!(t.say("/reset"), "");
    let alone = t.say(q2);
    assert_eq!(alone, generate(q2, true));
    assert_ne!(alone, a2, "the answer without the history should differ from the one with it");

    // A system prompt, and an answer stopped by Ctrl-C: the chat goes on with the answer
    // kept as far as it was shown.
    let system = "You are a pirate.";
    assert_eq!(t.say(&format!("/system {system}")), "");
    t.say("/reset");
    // An answer that runs to --max-tokens (SmolLM2 answers counting requests in one short
    // sentence, which could be shown whole before the Ctrl-C arrived).
    let long = "Tell me a long story about a dragon and a ship.";
    let start = t.shown.len();
    t.type_keys(&format!("{long}\n"));
    let echo = format!("{long}\n");
    t.wait_for("the first words of the answer", STEP_DEADLINE, |shown| shown.len() > start + echo.len());
    t.type_keys("\x03");
    t.wait_for("the prompt after Ctrl-C", STEP_DEADLINE, |shown| shown.ends_with("\n>> "));
    assert!(t.child.try_wait().unwrap().is_none(), "Ctrl-C ended the chat:\n{}", t.shown);
    // The terminal echoes ^C where the key was pressed.
    let stopped = shown_since(&t.shown[start + echo.len()..]).replace("^C", "");
    let full = generate_conversation(&[Message::new("system", system), user(long)]);
    assert!(!stopped.is_empty() && full.starts_with(&stopped) && stopped.len() < full.len(), "{stopped:?} of {full:?}");
    let thanks = "Thank you!";
    let a3 = t.say(thanks);
    let mut history = vec![(long.to_owned(), stopped), (thanks.to_owned(), a3.clone())];
    let messages = |history: &[(String, String)], next: &str| {
        let mut m = vec![Message::new("system", system)];
        for (q, a) in history {
            m.extend([user(q), assistant(a)]);
        }
        m.push(user(next));
        m
    };
    assert_eq!(a3, generate_conversation(&messages(&history[..1], thanks)));

    // A message that does not fit after the history drops the oldest turns first.
    // About 70 tokens: alone with the system prompt it fits the 96 the context leaves for a
    // prompt (128 less 32 for the answer), after any turn it does not.
    let big = "Tell me everything you know about the history, the geography, the rivers, the mountains, the food, the wine, the music, the painting, the architecture, the languages, the festivals and the famous people of Italy, Spain, Portugal, Greece, Croatia and Malta, from the oldest times to today.";
    let a4 = t.say(big);
    let err = t.stderr_text();
    let note = err.lines().find(|l| l.contains("dropped the oldest")).unwrap_or_else(|| panic!("no drop note:\n{err}"));
    let dropped: usize = note.split("dropped the oldest ").nth(1).unwrap().split(' ').next().unwrap().parse().unwrap();
    assert!(note.starts_with("chat: the context (128 positions) is full"), "{note}");
    assert!(dropped >= 1, "{note}");
    history.drain(..dropped);
    assert_eq!(a4, generate_conversation(&messages(&history, big)));

    t.type_keys("/exit\n");
    assert_eq!(t.exit_status(STEP_DEADLINE).code(), Some(0), "{}", t.stderr_text());
    let err = t.stderr_text();
    for line in ["chat: the conversation is forgotten", "chat: system prompt set", "chat: answer stopped (Ctrl-C)"] {
        assert!(err.contains(line), "`{line}` missing from stderr:\n{err}");
    }
    assert!(!err.contains("panicked"), "{err}");
}

#[test]
fn ctrl_c_or_ctrl_d_at_the_prompt_ends_the_chat() {
    for key in ["\x03", "\x04"] {
        let mut t = chat();
        t.type_keys(key);
        assert_eq!(t.exit_status(STEP_DEADLINE).code(), Some(0), "{key:?}: {}", t.stderr_text());
    }
}

#[test]
fn a_model_without_a_chat_template_is_refused_before_loading() {
    let dir = tempfile::tempdir().unwrap();
    for file in
        ["config.json", "model.safetensors", "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json"]
    {
        std::os::unix::fs::symlink(smollm2().join(file), dir.path().join(file)).unwrap();
    }
    let out = mlx_iree().arg("chat").arg("--model").arg(dir.path()).stdin(Stdio::null()).output().unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert_eq!(
        err.trim_end(),
        format!(
            "mlx-iree: error: model {} has no chat template (no chat_template.jinja, no chat_template in tokenizer_config.json)",
            dir.path().display()
        )
    );
    assert!(out.stdout.is_empty());
}

/// The gpt_oss fixture at f32 with the scripted harmony text side (tests/scripted/harmony):
/// its greedy chat answer reads `<|channel|>analysis<|message|>I think<|end|>` then
/// `<|message|>Paris<|return|>`.
fn harmony_model() -> tempfile::TempDir {
    common::scripted("gpt_oss", "harmony")
}

/// `generate --chat` and `chat` on a harmony model: the answer alone on stdout, the reasoning
/// on stderr after `thinking: `; `--reasoning-effort` reaches the template (one prompt token
/// more: ` t3`).
#[test]
fn reasoning_goes_to_stderr_and_the_answer_to_stdout() {
    let model = harmony_model();
    let run = |command: &str, extra: &[&str], stdin: &str| {
        let mut c = mlx_iree();
        c.args([command, "--precision", "f32", "--max-context", "32", "--kv-cache", "f32", "--model"]);
        c.arg(model.path()).args(extra).stdin(Stdio::piped()).stdout(Stdio::piped()).stderr(Stdio::piped());
        let mut child = c.spawn().unwrap();
        child.stdin.take().unwrap().write_all(stdin.as_bytes()).unwrap();
        let out = child.wait_with_output().unwrap();
        let (stdout, stderr) = (String::from_utf8(out.stdout).unwrap(), String::from_utf8(out.stderr).unwrap());
        assert!(out.status.success(), "{command} {extra:?}: {stderr}");
        (stdout, stderr)
    };
    let (stdout, stderr) = run("generate", &["--prompt", "What is the capital of France?", "--chat"], "");
    assert_eq!(stdout, "Paris\n");
    assert!(stderr.contains("thinking: I think\n"), "{stderr}");
    assert!(stderr.contains("prompt tokens: 1, generated tokens: 8,"), "{stderr}");
    let (_, stderr) = run("generate", &["--prompt", "Why?", "--chat", "--reasoning-effort", "high"], "");
    assert!(stderr.contains("prompt tokens: 2,"), "{stderr}");
    let (stdout, stderr) = run("chat", &[], "What is the capital of France?\n");
    assert_eq!(stdout, "Paris\n");
    assert!(stderr.contains("thinking: I think\n"), "{stderr}");
}
