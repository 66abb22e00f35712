//! `cargo xtask bench --draft`: what speculative decoding gains on a prompt-grounded task.
//! Per case, `mlx-iree generate --chat` is asked to rewrite a Python module of about 390
//! tokens with one change (xtask/testdata/rewrite_prompt.txt), greedy, `--steps` new tokens
//! (default 256), without and then with `--draft ngram`, `--repeats` times each in turn
//! (this machine's speed drifts over minutes: the two sides of a ratio stay in the same
//! minutes). Reported: the medians of decode tok/s from generate's summary lines, their
//! ratio, the draft tokens accepted and the tokens per model call; the two answers must be
//! the same text (a row whose answers differ fails). With `--streams LIST`, the same task
//! through `mlx-iree serve` instead ([`measure_streams`]): per stream count N, N concurrent
//! requests to a server without and then one with drafts (several sequences' drafts are
//! checked together in one call), aggregate tok/s and their ratio.

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
        cmd.args(draft_args());
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

/// What every JSON line of `--draft` starts with: the engine, the mode, the case, the drafts.
fn json_head(case: &Case, device: &str, mode: &str) -> serde_json::Value {
    serde_json::json!({
        "engine": "mlx-iree",
        "mode": mode,
        "model": model_name(case),
        "precision": case.precision,
        "device": device,
        "draft": "ngram",
        "draft_tokens": DRAFT_TOKENS,
        "max_tokens": case.steps,
    })
}

/// The case's model folder's name.
fn model_name(case: &Case) -> String {
    case.model.file_name().map_or_else(String::new, |n| n.to_string_lossy().into_owned())
}

/// One JSON object per row.
pub fn json_line(row: &Row, device: &str) -> String {
    let mut v = json_head(&row.case, device, "draft");
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
        let name = model_name(&r.case);
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

/// One `--draft --streams` row: a stream count's aggregate tok/s without and with drafts
/// (the medians of the rounds) and the verify calls of the drafting server's last round, or
/// why it failed.
#[derive(Debug, Clone)]
pub struct StreamsRow {
    pub case: Case,
    pub streams: usize,
    pub result: std::result::Result<(f64, f64, u64), String>,
}

/// What `serve_rewrite.py` prints.
#[derive(Debug, Clone, serde::Deserialize)]
struct Load {
    tok_s: f64,
    answers: String,
}

/// `--draft --streams`: per round (`--repeats`), one `mlx-iree serve` without drafts and
/// then one with `--draft ngram` (slots: the most streams), each sent, per stream count N,
/// N concurrent rewrite requests (`serve_rewrite.py`); a row per stream count. The answers
/// of every round and server must be the same (greedy).
pub fn measure_streams(bin: &Path, case: &Case, o: &Options) -> Result<Vec<StreamsRow>> {
    /// One stream count's rounds: tok/s without and with drafts, the first answers, the
    /// drafting server's verify calls, the first failure.
    #[derive(Default)]
    struct Tally {
        plain: Vec<f64>,
        drafted: Vec<f64>,
        answers: Option<String>,
        verify_calls: u64,
        error: Option<String>,
    }
    let slots = o.streams.iter().copied().max().unwrap_or(1);
    let mut tallies: Vec<Tally> = o.streams.iter().map(|_| Tally::default()).collect();
    let o = Options { max_context: Some(o.max_context.unwrap_or(1024)), ..o.clone() };
    let with_drafts = draft_args();
    for _ in 0..o.repeats {
        for draft in [false, true] {
            let extra: Vec<&str> = if draft { with_drafts.iter().map(String::as_str).collect() } else { Vec::new() };
            let (server, addr) = crate::serve_bench::start_with(bin, case, &o, slots, true, &extra)?;
            for (t, &streams) in tallies.iter_mut().zip(&o.streams) {
                let before = verify_count(&addr);
                match rewrite(&addr, streams, case.steps) {
                    Ok(load) => {
                        if t.answers.get_or_insert_with(|| load.answers.clone()) != &load.answers {
                            t.error = Some("greedy answers differ between runs (with and without drafts)".into());
                        }
                        if draft {
                            t.drafted.push(load.tok_s);
                            t.verify_calls = verify_count(&addr).saturating_sub(before);
                        } else {
                            t.plain.push(load.tok_s);
                        }
                    }
                    Err(e) => t.error = Some(format!("{e:#}")),
                }
            }
            drop(server);
        }
    }
    Ok(tallies
        .into_iter()
        .zip(&o.streams)
        .map(|(t, &streams)| StreamsRow {
            case: case.clone(),
            streams,
            result: match t.error {
                Some(e) => Err(e),
                None => Ok((median(t.plain), median(t.drafted), t.verify_calls)),
            },
        })
        .collect())
}

/// The arguments that turn drafts on, in both modes.
fn draft_args() -> [String; 4] {
    ["--draft", "ngram", "--draft-tokens", &DRAFT_TOKENS.to_string()].map(str::to_owned)
}

/// `serve_rewrite.py` against the server at `addr`: `streams` concurrent rewrite requests.
fn rewrite(addr: &str, streams: usize, max_tokens: usize) -> Result<Load> {
    let venv = util::target_dir().join("client-venv");
    let prompt = util::root().join("xtask/testdata/rewrite_prompt.txt");
    let mut client = crate::fixtures::python(&venv, "serve_rewrite.py");
    let out = util::dies_with_parent(&mut client)
        .args([format!("http://{addr}/v1"), "bench".into(), streams.to_string(), max_tokens.to_string()])
        .arg(&prompt)
        .stderr(std::process::Stdio::inherit())
        .output()?;
    if !out.status.success() {
        bail!("serve_rewrite.py against http://{addr} failed");
    }
    serde_json::from_slice(&out.stdout)
        .with_context(|| format!("serve_rewrite.py printed {:?}", String::from_utf8_lossy(&out.stdout)))
}

/// The server's verify calls so far (`/metrics`), 0 where it does not say.
fn verify_count(addr: &str) -> u64 {
    crate::serve_bench::http_body(addr, "/metrics").map_or(0, |body| parse_verify_calls(&body))
}

/// `mlx_iree_verify_calls_total` of a metrics page, 0 where it is not there.
pub fn parse_verify_calls(metrics: &str) -> u64 {
    metrics
        .lines()
        .find_map(|l| l.strip_prefix("mlx_iree_verify_calls_total "))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

/// One JSON object per `--draft --streams` row.
pub fn streams_json_line(row: &StreamsRow, device: &str) -> String {
    let mut v = json_head(&row.case, device, "draft-serve");
    v["streams"] = row.streams.into();
    match &row.result {
        Ok((plain, draft, calls)) => {
            v["plain_tok_s"] = (*plain).into();
            v["draft_tok_s"] = (*draft).into();
            v["ratio"] = (draft / plain).into();
            v["verify_calls"] = (*calls).into();
        }
        Err(e) => v["error"] = e.clone().into(),
    }
    v.to_string()
}

/// The human table of `--draft --streams`.
pub fn streams_table(rows: &[StreamsRow]) -> String {
    let mut out = String::from(
        "model                              precision  streams  plain tok/s  draft tok/s  ratio  verify calls\n",
    );
    for r in rows {
        let name = model_name(&r.case);
        match &r.result {
            Ok((plain, draft, calls)) => out.push_str(&format!(
                "{name:<34} {:<10} {:>7}  {plain:>11.1}  {draft:>11.1}  {:>4.2}x  {calls:>12}\n",
                r.case.precision,
                r.streams,
                draft / plain
            )),
            Err(e) => out.push_str(&format!("{name:<34} {:<10} {:>7}  failed: {e}\n", r.case.precision, r.streams)),
        }
    }
    out.push_str(&format!(
        "(greedy; `mlx-iree serve`, STREAMS concurrent chat requests rewriting xtask/testdata/rewrite_prompt.txt, aggregate tok/s from the first request to the last answer, prompts included; draft = --draft ngram --draft-tokens {DRAFT_TOKENS}; medians of the rounds)\n"
    ));
    out
}

/// Refuses what `--draft` cannot measure.
pub fn check(o: &Options) -> Result<()> {
    if o.serve || o.peers || o.batch != [1] || !o.context.is_empty() || !o.kv_cache.is_empty() {
        bail!(
            "bench: `--draft` takes --model, --precision, --device, --steps, --repeats, --max-context, --streams and --json only"
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
    fn verify_calls_come_from_the_metrics_page() {
        let page = "# HELP mlx_iree_verify_calls_total Calls that checked draft tokens.\n# TYPE mlx_iree_verify_calls_total counter\nmlx_iree_verify_calls_total 322\nmlx_iree_draft_tokens_total 900\n";
        assert_eq!(parse_verify_calls(page), 322);
        assert_eq!(parse_verify_calls("mlx_iree_requests_total 3\n"), 0);
    }

    #[test]
    fn the_streams_table_gives_each_count_its_ratio() {
        let case = Case {
            family: "llama".into(),
            model: "/m/smollm2-135m-instruct-4bit".into(),
            precision: "packed",
            steps: 256,
            kv_cache: None,
            activations: None,
        };
        let rows = [
            StreamsRow { case: case.clone(), streams: 2, result: Ok((150.0, 225.0, 40)) },
            StreamsRow { case, streams: 4, result: Err("greedy answers differ".into()) },
        ];
        let table = streams_table(&rows);
        let lines: Vec<&str> = table.lines().collect();
        assert!(lines[1].starts_with("smollm2-135m-instruct-4bit") && lines[1].contains("1.50x"), "{table}");
        assert!(lines[1].split_whitespace().any(|w| w == "40") && lines[2].contains("failed: greedy answers differ"));
        let json: serde_json::Value = serde_json::from_str(&streams_json_line(&rows[0], "local-task")).unwrap();
        assert_eq!(
            (json["mode"].as_str(), json["streams"].as_u64(), json["ratio"].as_f64()),
            (Some("draft-serve"), Some(2), Some(1.5))
        );
    }

    #[test]
    fn the_task_is_a_module_of_about_400_tokens() {
        assert!(PROMPT.contains("def load_items(path):") && PROMPT.contains("Rename the function `load_items`"));
        let words = PROMPT.split_whitespace().count();
        assert!((150..400).contains(&words), "{words} words");
    }
}
