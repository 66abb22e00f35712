//! `cargo xtask bench --draft`: what speculative decoding gains on a prompt-grounded task.
//! Per case, `mlx-iree generate --chat` is asked to rewrite a Python module of about 390
//! tokens with one change (xtask/testdata/rewrite_prompt.txt), greedy, `--steps` new tokens
//! (default 256), without and then with `--draft ngram`, `--repeats` times each in turn
//! (this machine's speed drifts over minutes: the two sides of a ratio stay in the same
//! minutes). Reported: the medians of decode tok/s from generate's summary lines, their
//! ratio, the draft tokens accepted and the tokens per model call; the two answers must be
//! the same text (a row whose answers differ fails).

use crate::bench::{Case, Options, error_note};
use crate::util;
use anyhow::{Context, Result, bail};
use std::path::Path;
use std::process::Command;

/// The task: a module to rewrite with one function renamed.
const PROMPT: &str = include_str!("../testdata/rewrite_prompt.txt");
/// New tokens per run when `--steps` is not given.
pub const DEFAULT_STEPS: usize = 256;
/// Draft tokens per call.
const DRAFT_TOKENS: usize = 4;

/// One run's summary line, as numbers.
#[derive(Debug, Clone, PartialEq)]
pub struct Summary {
    pub generated: usize,
    pub decode_tok_s: f64,
    /// (accepted, drafted, tokens per call), with `--draft`.
    pub draft: Option<(usize, usize, f64)>,
}

/// Reads generate's summary line ("prompt tokens: ..., generated tokens: N, ..., decode: X
/// tok/s[, draft: A/D accepted (P%), T tokens per call], ...").
pub fn parse_summary(stderr: &str) -> Result<Summary> {
    let line = stderr
        .lines()
        .rev()
        .find(|l| l.starts_with("prompt tokens: "))
        .with_context(|| format!("no summary line in {stderr:?}"))?;
    let after = |key: &str| -> Result<&str> {
        let at = line.find(key).with_context(|| format!("no `{key}` in {line:?}"))?;
        Ok(&line[at + key.len()..])
    };
    let word = |s: &str| s.split([' ', ',', '/']).next().unwrap_or("").to_owned();
    let generated =
        word(after("generated tokens: ")?).parse().with_context(|| format!("generated tokens in {line:?}"))?;
    let decode_tok_s = word(after("decode: ")?).parse().with_context(|| format!("decode tok/s in {line:?}"))?;
    let draft = match line.find("draft: ") {
        None => None,
        Some(_) => {
            let rest = after("draft: ")?;
            let (accepted, rest) = rest.split_once('/').with_context(|| format!("draft counts in {line:?}"))?;
            let drafted = word(rest);
            let per_call = word(after("accepted (")?.split_once("), ").map_or("", |(_, r)| r));
            Some((
                accepted.parse().with_context(|| format!("accepted in {line:?}"))?,
                drafted.parse().with_context(|| format!("drafted in {line:?}"))?,
                per_call.parse().with_context(|| format!("tokens per call in {line:?}"))?,
            ))
        }
    };
    Ok(Summary { generated, decode_tok_s, draft })
}

/// One case's result: the medians without and with drafts, or why it failed.
#[derive(Debug, Clone)]
pub struct Row {
    pub case: Case,
    pub result: std::result::Result<(Summary, Summary), String>,
}

fn median(mut xs: Vec<f64>) -> f64 {
    xs.sort_by(f64::total_cmp);
    xs[xs.len() / 2]
}

/// One generate run: its answer (stdout) and summary, or the reason it failed.
fn generate(
    bin: &Path,
    case: &Case,
    o: &Options,
    draft: bool,
) -> Result<std::result::Result<(String, Summary), String>> {
    let mut cmd = Command::new(bin);
    cmd.arg("generate")
        .arg("--model")
        .arg(&case.model)
        .args(["--precision", case.precision, "--device", &o.device, "--chat", "--prompt", PROMPT])
        .args(["--max-tokens", &case.steps.to_string()])
        .args(["--max-context", &o.max_context.unwrap_or(1024).to_string()]);
    if draft {
        cmd.args(["--draft", "ngram", "--draft-tokens", &DRAFT_TOKENS.to_string()]);
    }
    let shown = util::show(&cmd).replace(PROMPT, "<rewrite_prompt.txt>");
    let out = util::dies_with_parent(&mut cmd).output().with_context(|| format!("could not start `{shown}`"))?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !out.status.success() {
        let last = stderr.lines().rev().find(|l| !l.trim().is_empty()).unwrap_or("");
        return Ok(Err(format!("`{shown}`: {}", error_note(last))));
    }
    let summary = parse_summary(&stderr).with_context(|| format!("`{shown}`"))?;
    Ok(Ok((String::from_utf8_lossy(&out.stdout).into_owned(), summary)))
}

/// Every case without and with drafts, alternating, `--repeats` times.
pub fn measure(bin: &Path, case: &Case, o: &Options) -> Result<Row> {
    let (mut plain, mut drafted) = (Vec::new(), Vec::new());
    for _ in 0..o.repeats {
        for (draft, into) in [(false, &mut plain), (true, &mut drafted)] {
            match generate(bin, case, o, draft)? {
                Ok(run) => into.push(run),
                Err(e) => return Ok(Row { case: case.clone(), result: Err(e) }),
            }
        }
    }
    let answer = &plain[0].0;
    if let Some((text, _)) = drafted.iter().chain(&plain).find(|(text, _)| text != answer) {
        let result = Err(format!("greedy answers differ with and without drafts: {answer:?} vs {text:?}"));
        return Ok(Row { case: case.clone(), result });
    }
    let summarize = |runs: &[(String, Summary)]| Summary {
        generated: runs[0].1.generated,
        decode_tok_s: median(runs.iter().map(|r| r.1.decode_tok_s).collect()),
        draft: runs[0].1.draft.map(|_| {
            let of = |f: fn(&(usize, usize, f64)) -> f64| {
                median(runs.iter().filter_map(|r| r.1.draft.as_ref().map(f)).collect())
            };
            (of(|d| d.0 as f64) as usize, of(|d| d.1 as f64) as usize, of(|d| d.2))
        }),
    };
    Ok(Row { case: case.clone(), result: Ok((summarize(&plain), summarize(&drafted))) })
}

/// One JSON object per row.
pub fn json_line(row: &Row, device: &str) -> String {
    let mut v = serde_json::json!({
        "engine": "mlx-iree",
        "mode": "draft",
        "model": row.case.model.file_name().map(|n| n.to_string_lossy().into_owned()),
        "precision": row.case.precision,
        "device": device,
        "draft": "ngram",
        "draft_tokens": DRAFT_TOKENS,
        "max_tokens": row.case.steps,
    });
    match &row.result {
        Ok((plain, draft)) => {
            let (accepted, drafted, per_call) = draft.draft.unwrap_or((0, 0, 0.0));
            v["generated"] = plain.generated.into();
            v["plain_decode_tok_s"] = plain.decode_tok_s.into();
            v["draft_decode_tok_s"] = draft.decode_tok_s.into();
            v["ratio"] = (draft.decode_tok_s / plain.decode_tok_s).into();
            v["accepted"] = accepted.into();
            v["drafted"] = drafted.into();
            v["tokens_per_call"] = per_call.into();
        }
        Err(e) => v["error"] = e.clone().into(),
    }
    v.to_string()
}

/// The human table.
pub fn table(rows: &[Row]) -> String {
    let mut out = String::from(
        "model                              precision  tokens  plain tok/s  draft tok/s  ratio  accepted     tokens/call\n",
    );
    for r in rows {
        let name = r.case.model.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned());
        match &r.result {
            Ok((plain, draft)) => {
                let (accepted, drafted, per_call) = draft.draft.unwrap_or((0, 0, 0.0));
                out.push_str(&format!(
                    "{name:<34} {:<10} {:>6}  {:>11.1}  {:>11.1}  {:>4.2}x  {:>5}/{:<5}  {per_call:>11.2}\n",
                    r.case.precision,
                    plain.generated,
                    plain.decode_tok_s,
                    draft.decode_tok_s,
                    draft.decode_tok_s / plain.decode_tok_s,
                    accepted,
                    drafted
                ));
            }
            Err(e) => out.push_str(&format!("{name:<34} {:<10} failed: {e}\n", r.case.precision)),
        }
    }
    out.push_str(&format!(
        "(greedy; `generate --chat` rewriting xtask/testdata/rewrite_prompt.txt; draft = --draft ngram --draft-tokens {DRAFT_TOKENS}; medians of the runs)\n"
    ));
    out
}

/// Refuses what `--draft` cannot measure.
pub fn check(o: &Options) -> Result<()> {
    if o.serve || o.peers || o.batch != [1] || !o.context.is_empty() || !o.kv_cache.is_empty() {
        bail!(
            "bench: `--draft` takes --model, --precision, --device, --steps, --repeats, --max-context and --json only"
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summary_lines_with_and_without_drafts() {
        let plain = "engine ready\nprompt tokens: 387, generated tokens: 400, prefill: 582.7 tok/s, decode: 102.8 tok/s, compiled in 14.4 s, weights loaded in 0.6 s (local-task, packed)\n";
        assert_eq!(parse_summary(plain).unwrap(), Summary { generated: 400, decode_tok_s: 102.8, draft: None });
        let draft = "prompt tokens: 387, generated tokens: 400, prefill: 613.4 tok/s, decode: 175.0 tok/s, draft: 277/347 accepted (80%), 3.27 tokens per call, compiled in 18.9 s, weights loaded in 0.7 s (local-task, packed)";
        assert_eq!(
            parse_summary(draft).unwrap(),
            Summary { generated: 400, decode_tok_s: 175.0, draft: Some((277, 347, 3.27)) }
        );
        assert!(parse_summary("mlx-iree: error: no such model").is_err());
        assert!(parse_summary("prompt tokens: 3, generated tokens: x, decode: 1 tok/s").is_err());
    }

    #[test]
    fn the_task_is_a_module_of_about_400_tokens() {
        assert!(PROMPT.contains("def load_items(path):") && PROMPT.contains("Rename the function `load_items`"));
        let words = PROMPT.split_whitespace().count();
        assert!((150..400).contains(&words), "{words} words");
    }
}
