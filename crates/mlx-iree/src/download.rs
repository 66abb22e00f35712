//! `--model owner/name[@revision]`: a Hugging Face repo id resolved to a snapshot folder of
//! the standard Hugging Face cache (crates/hub), with a progress line per file on stderr.
//! The hub settings come from `HF_ENDPOINT`, `HF_TOKEN`, `HF_HUB_OFFLINE`, `HF_HOME` and
//! `HF_HUB_CACHE`, read here and passed to the library as values.

use anyhow::{Context, Result, anyhow, bail};
use std::io::{IsTerminal, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

/// What `--model` names: a local folder when one exists at that path (or the text is no
/// repo id), else a hub repo (`owner/name[@revision]`) resolved to its cached snapshot,
/// downloading what is missing. Returns the folder and, for a repo, its id.
pub fn resolve(model: &Path, offline: bool) -> Result<(PathBuf, Option<String>)> {
    let Some(text) = model.to_str() else { return Ok((model.to_path_buf(), None)) };
    if model.exists() {
        return Ok((model.to_path_buf(), None));
    }
    let Ok(repo) = hub::RepoRef::parse(text) else { return Ok((model.to_path_buf(), None)) };
    let hub = hub::Hub::new(hub_config(offline)?);
    let model = hub.model(&repo).map_err(|e| not_found_here(e, text))?;
    let mut progress = StderrProgress::new();
    // Checked before any weight is downloaded: the repo must be a model this engine runs.
    let config = model.fetch(hub::CONFIG_FILE, &mut progress)?;
    models::ModelConfig::from_file(&config).map_err(|e| anyhow!("{} is not a model mlx-iree runs: {e}", repo.id))?;
    let dir = model.fetch_model(&mut progress)?;
    tracing::debug!("{repo}: commit {} in {}", model.commit(), dir.display());
    Ok((dir, Some(repo.id)))
}

/// A repo the hub does not know (or cannot be asked about) may have been meant as a local
/// folder: say both.
fn not_found_here(e: hub::Error, text: &str) -> anyhow::Error {
    match e {
        hub::Error::RepoNotFound { .. } | hub::Error::Unreachable { .. } => {
            anyhow!("{e}, and there is no folder `{text}` here")
        }
        other => other.into(),
    }
}

/// The hub settings from the environment (the library reads none itself); `offline` is
/// `--offline`, which wins over `HF_HUB_OFFLINE`.
fn hub_config(offline: bool) -> Result<hub::HubConfig> {
    let var = |name: &str| std::env::var_os(name);
    let mut config = hub::HubConfig::new(hub::default_cache_dir(var));
    if let Some(endpoint) = std::env::var("HF_ENDPOINT").ok().filter(|e| !e.is_empty()) {
        if !endpoint.starts_with("http://") && !endpoint.starts_with("https://") {
            bail!("HF_ENDPOINT: expected an http:// or https:// URL, got `{endpoint}`");
        }
        config.endpoint = endpoint;
    }
    config.offline = offline || self::offline()?;
    config.token = match std::env::var("HF_TOKEN").ok().filter(|t| !t.trim().is_empty()) {
        Some(token) => Some(token.trim().to_owned()),
        // The token `huggingface-cli login` saved, as huggingface_hub reads it.
        None => std::fs::read_to_string(hub::huggingface_home(var).join("token"))
            .ok()
            .map(|t| t.trim().to_owned())
            .filter(|t| !t.is_empty()),
    };
    Ok(config)
}

/// `HF_HUB_OFFLINE`: `1`/`true`/`yes`/`on` uses the cache only (as huggingface_hub reads it).
fn offline() -> Result<bool> {
    const VAR: &str = "HF_HUB_OFFLINE";
    match std::env::var(VAR) {
        Err(std::env::VarError::NotPresent) => Ok(false),
        Ok(v) => match v.trim().to_ascii_lowercase().as_str() {
            "1" | "true" | "yes" | "on" => Ok(true),
            "" | "0" | "false" | "no" | "off" => Ok(false),
            other => bail!("{VAR}: expected 1 or 0, got `{other}`"),
        },
        Err(e) => Err(e).context(VAR),
    }
}

/// One progress line per file on stderr: redrawn in place on a terminal (bytes, rate, ETA),
/// else a line when the file starts and one when it is done.
struct StderrProgress {
    tty: bool,
    file: String,
    total: Option<u64>,
    resumed: u64,
    done: u64,
    started: Instant,
    drawn: Option<Instant>,
    /// A line is drawn on the terminal without its newline yet.
    open: bool,
}

impl Drop for StderrProgress {
    /// A download that failed leaves its line finished, so the error starts a line of its own.
    fn drop(&mut self) {
        if self.open {
            eprintln!();
        }
    }
}

impl StderrProgress {
    fn new() -> Self {
        StderrProgress {
            tty: std::io::stderr().is_terminal(),
            file: String::new(),
            total: None,
            resumed: 0,
            done: 0,
            started: Instant::now(),
            drawn: None,
            open: false,
        }
    }

    fn draw(&self) {
        let seconds = self.started.elapsed().as_secs_f64().max(1e-3);
        let rate = (self.done - self.resumed) as f64 / seconds;
        let mut line = format!("downloading {}: {}", self.file, mib(self.done));
        if let Some(total) = self.total {
            line += &format!(" / {} ({:.0}%)", mib(total), 100.0 * self.done as f64 / total.max(1) as f64);
        }
        line += &format!(", {}/s", mib(rate as u64));
        if let Some(total) = self.total
            && rate > 0.0
        {
            line += &format!(", ETA {}", eta(Duration::from_secs_f64(total.saturating_sub(self.done) as f64 / rate)));
        }
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r{line}\x1b[K");
        let _ = err.flush();
    }
}

impl hub::Progress for StderrProgress {
    fn start(&mut self, file: &str, total: Option<u64>, resumed_from: u64) {
        self.file = file.to_owned();
        self.total = total;
        self.resumed = resumed_from;
        self.done = resumed_from;
        self.started = Instant::now();
        self.drawn = None;
        if self.tty {
            self.open = true;
            self.draw();
        } else {
            let size = total.map_or_else(String::new, |t| format!(" ({})", mib(t)));
            let from = if resumed_from > 0 { format!(", resuming at {}", mib(resumed_from)) } else { String::new() };
            eprintln!("downloading {file}{size}{from}");
        }
    }

    fn advance(&mut self, done: u64) {
        self.done = done;
        if self.tty && self.drawn.is_none_or(|t| t.elapsed() >= Duration::from_millis(200)) {
            self.draw();
            self.drawn = Some(Instant::now());
        }
    }

    fn finish(&mut self, file: &str, bytes: u64) {
        let seconds = self.started.elapsed().as_secs_f64();
        let rate = bytes.saturating_sub(self.resumed) as f64 / seconds.max(1e-3);
        let line = format!("downloaded {file}: {} in {seconds:.1} s ({}/s)", mib(bytes), mib(rate as u64));
        if self.tty {
            self.open = false;
            eprintln!("\r{line}\x1b[K");
        } else {
            eprintln!("{line}");
        }
    }
}

fn mib(bytes: u64) -> String {
    if bytes < 1 << 20 {
        format!("{:.1} KiB", bytes as f64 / 1024.0)
    } else {
        format!("{:.1} MiB", bytes as f64 / 1048576.0)
    }
}

fn eta(d: Duration) -> String {
    let s = d.as_secs();
    if s >= 3600 {
        format!("{}h{:02}m", s / 3600, s / 60 % 60)
    } else if s >= 60 {
        format!("{}m{:02}s", s / 60, s % 60)
    } else {
        format!("{s}s")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_and_times_read_well() {
        assert_eq!(mib(512), "0.5 KiB");
        assert_eq!(mib(3 << 20), "3.0 MiB");
        assert_eq!(eta(Duration::from_secs(42)), "42s");
        assert_eq!(eta(Duration::from_secs(125)), "2m05s");
        assert_eq!(eta(Duration::from_secs(3725)), "1h02m");
    }
}
