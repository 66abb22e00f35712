//! The accuracy gate: a precision (or device) against a reference trajectory, per prompt:
//! token-exact steps, first divergence, and teacher-forced top-1 agreement.
//!
//! Teacher forcing feeds the reference tokens and compares the candidate's greedy choice
//! at every step, so one divergence does not hide how the rest of the run agrees. Its
//! leading run of agreements is exactly the free-running token-exact prefix.

use crate::{Engine, Result};

/// One prompt's reference: what the oracle generated greedily after `prompt_ids`.
#[derive(Debug, Clone, PartialEq)]
pub struct Reference {
    pub prompt_ids: Vec<u32>,
    pub token_ids: Vec<u32>,
}

#[derive(Debug, Clone, PartialEq)]
pub struct PromptResult {
    pub prompt_len: usize,
    pub steps: usize,
    /// Leading steps where the candidate chose the reference token.
    pub exact_steps: usize,
    /// First step where it did not (None: token-exact for all steps).
    pub first_divergence: Option<usize>,
    /// Steps where the candidate's choice equals the reference token under teacher forcing.
    pub agreeing_steps: usize,
}

impl PromptResult {
    pub fn agreement(&self) -> f64 {
        self.agreeing_steps as f64 / self.steps.max(1) as f64
    }
}

/// Pass when every prompt is token-exact, or teacher-forced top-1 agreement over all steps
/// is at least this.
pub const MIN_AGREEMENT: f64 = 0.99;

#[derive(Debug, Clone, PartialEq)]
pub struct Report {
    pub prompts: Vec<PromptResult>,
}

impl Report {
    pub fn all_exact(&self) -> bool {
        self.prompts.iter().all(|p| p.first_divergence.is_none())
    }

    pub fn agreement(&self) -> f64 {
        let (agree, total) = self.prompts.iter().fold((0, 0), |(a, t), p| (a + p.agreeing_steps, t + p.steps));
        agree as f64 / total.max(1) as f64
    }

    pub fn passed(&self) -> bool {
        self.all_exact() || self.agreement() >= MIN_AGREEMENT
    }
}

/// Greedy trajectory of `steps` tokens after `prompt` (EOS ignored).
pub fn trajectory(engine: &mut Engine, prompt: &[u32], steps: usize) -> Result<Vec<u32>> {
    engine.reset(0);
    let mut step = engine.prefill(0, prompt)?;
    let mut out = vec![step.next];
    while out.len() < steps {
        step = engine.decode_one(0, step.next)?;
        out.push(step.next);
    }
    Ok(out)
}

/// Runs `candidate` teacher-forced along each reference.
pub fn check(candidate: &mut Engine, references: &[Reference]) -> Result<Report> {
    let mut prompts = Vec::new();
    for r in references {
        candidate.reset(0);
        let mut choices = vec![candidate.prefill(0, &r.prompt_ids)?.next];
        for forced in r.token_ids.iter().take(r.token_ids.len().saturating_sub(1)) {
            choices.push(candidate.decode_one(0, *forced)?.next);
        }
        let agree: Vec<bool> = choices.iter().zip(&r.token_ids).map(|(a, b)| a == b).collect();
        let exact_steps = agree.iter().take_while(|a| **a).count();
        prompts.push(PromptResult {
            prompt_len: r.prompt_ids.len(),
            steps: r.token_ids.len(),
            exact_steps,
            first_divergence: (exact_steps < agree.len()).then_some(exact_steps),
            agreeing_steps: agree.iter().filter(|a| **a).count(),
        });
    }
    Ok(Report { prompts })
}

/// Reads references from trajectory JSON: one `{"prompt_ids", "token_ids", ...}` object
/// (`mlx-iree trajectory` output) or `{"trajectories": [...]}` (the mlx-lm fixtures'
/// `expected.json` and the models' `oracle.json`).
pub fn references_from_json(text: &str) -> std::result::Result<Vec<Reference>, String> {
    let v: serde_json::Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let ids = |t: &serde_json::Value, key: &str| -> std::result::Result<Vec<u32>, String> {
        t[key]
            .as_array()
            .ok_or_else(|| format!("missing `{key}` list"))?
            .iter()
            .map(|x| {
                x.as_u64().and_then(|n| u32::try_from(n).ok()).ok_or_else(|| format!("`{key}` holds a non-id {x}"))
            })
            .collect()
    };
    let items: Vec<&serde_json::Value> = match v.get("trajectories").and_then(|t| t.as_array()) {
        Some(list) => list.iter().collect(),
        None => vec![&v],
    };
    let refs = items
        .into_iter()
        .map(|t| Ok(Reference { prompt_ids: ids(t, "prompt_ids")?, token_ids: ids(t, "token_ids")? }))
        .collect::<std::result::Result<Vec<_>, String>>()?;
    if refs.iter().any(|r| r.prompt_ids.is_empty() || r.token_ids.is_empty()) {
        return Err("a trajectory has an empty `prompt_ids` or `token_ids`".into());
    }
    Ok(refs)
}
