//! Next-token sampling from logits: greedy at temperature 0, otherwise temperature, top-k,
//! top-p (nucleus) and min-p filtering and a draw from a seeded xoshiro256** generator, so a
//! fixed seed gives the same tokens on every run and platform. Before either, the logits are
//! adjusted as llama.cpp's and vLLM's samplers do: `logit_bias` added, then the repetition,
//! frequency and presence penalties over the tokens this sampler has chosen so far (the
//! generated tokens; the prompt does not count). [`logprobs`] gives the model's own
//! distribution (the log-softmax of the logits as they came, before any of that).

use std::collections::HashMap;

/// How to pick the next token; the CLI's `--temperature --top-k --top-p --min-p
/// --presence-penalty --frequency-penalty --repetition-penalty --logit-bias --seed`.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// 0 is greedy (argmax); higher flattens the distribution.
    pub temperature: f32,
    /// Keep only the k most likely tokens.
    pub top_k: Option<usize>,
    /// Keep the smallest set of most likely tokens whose probability reaches p.
    pub top_p: Option<f32>,
    /// Keep only tokens at least this fraction as likely as the most likely one (after
    /// temperature; 0 to 1).
    pub min_p: Option<f32>,
    /// Subtracted once from the logit of every token chosen so far (OpenAI's
    /// `presence_penalty`, -2 to 2; 0 is off).
    pub presence_penalty: f32,
    /// Subtracted from a token's logit once per time it was chosen so far (OpenAI's
    /// `frequency_penalty`, -2 to 2; 0 is off).
    pub frequency_penalty: f32,
    /// The logits of tokens chosen so far divided by it when positive, multiplied when not
    /// (CTRL's penalty as transformers, llama.cpp and vLLM apply it; > 0, 1 is off).
    pub repetition_penalty: f32,
    /// Added to these ids' logits before anything else (OpenAI's `logit_bias`, -100 to 100:
    /// -100 bans a token, 100 all but forces it).
    pub logit_bias: Vec<(u32, f32)>,
    pub seed: u64,
}

impl Default for SamplingParams {
    /// Greedy, nothing adjusted.
    fn default() -> Self {
        Self {
            temperature: 0.0,
            top_k: None,
            top_p: None,
            min_p: None,
            presence_penalty: 0.0,
            frequency_penalty: 0.0,
            repetition_penalty: 1.0,
            logit_bias: Vec::new(),
            seed: 0,
        }
    }
}

/// Most a penalty may be either way (OpenAI's range for presence and frequency penalties).
pub const MAX_PENALTY: f32 = 2.0;
/// Most a `logit_bias` value may be either way (OpenAI's range).
pub const MAX_LOGIT_BIAS: f32 = 100.0;

impl SamplingParams {
    /// Whether the logits are changed before the choice (bias or a penalty set).
    pub fn adjusts_logits(&self) -> bool {
        !self.logit_bias.is_empty() || self.penalises()
    }

    /// Whether any penalty over the chosen tokens is set.
    fn penalises(&self) -> bool {
        self.presence_penalty != 0.0 || self.frequency_penalty != 0.0 || self.repetition_penalty != 1.0
    }

    /// Whether the choice is the plain argmax of the logits as they come (temperature 0,
    /// nothing adjusted), which a device can make without the logits leaving it.
    pub fn is_plain_greedy(&self) -> bool {
        self.temperature == 0.0 && !self.adjusts_logits()
    }

    /// Checks every setting against its range.
    pub fn check(&self) -> Result<(), SamplingError> {
        if !self.temperature.is_finite() || self.temperature < 0.0 {
            return Err(SamplingError::Temperature(self.temperature));
        }
        if let Some(p) = self.top_p
            && !(p > 0.0 && p <= 1.0)
        {
            return Err(SamplingError::TopP(p));
        }
        if self.top_k == Some(0) {
            return Err(SamplingError::TopK(0));
        }
        if let Some(p) = self.min_p
            && !(0.0..=1.0).contains(&p)
        {
            return Err(SamplingError::MinP(p));
        }
        if !(-MAX_PENALTY..=MAX_PENALTY).contains(&self.presence_penalty) {
            return Err(SamplingError::PresencePenalty(self.presence_penalty));
        }
        if !(-MAX_PENALTY..=MAX_PENALTY).contains(&self.frequency_penalty) {
            return Err(SamplingError::FrequencyPenalty(self.frequency_penalty));
        }
        if !(self.repetition_penalty.is_finite() && self.repetition_penalty > 0.0) {
            return Err(SamplingError::RepetitionPenalty(self.repetition_penalty));
        }
        for &(token, bias) in &self.logit_bias {
            if !(-MAX_LOGIT_BIAS..=MAX_LOGIT_BIAS).contains(&bias) {
                return Err(SamplingError::LogitBias { token, bias });
            }
        }
        Ok(())
    }

    /// Checks that every `logit_bias` id is in a vocabulary of `vocab` ids.
    pub fn check_vocab(&self, vocab: usize) -> Result<(), SamplingError> {
        match self.logit_bias.iter().find(|(token, _)| *token as usize >= vocab) {
            Some(&(token, _)) => Err(SamplingError::LogitBiasId { token, vocab }),
            None => Ok(()),
        }
    }
}

/// Bad sampling settings (named by their CLI flag) or unusable logits.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum SamplingError {
    #[error("--temperature must be a finite number >= 0, got {0}")]
    Temperature(f32),
    #[error("--top-p must be greater than 0 and at most 1, got {0}")]
    TopP(f32),
    #[error("--top-k must be at least 1, got {0}")]
    TopK(usize),
    #[error("--min-p must be between 0 and 1, got {0}")]
    MinP(f32),
    #[error("--presence-penalty must be between -2 and 2, got {0}")]
    PresencePenalty(f32),
    #[error("--frequency-penalty must be between -2 and 2, got {0}")]
    FrequencyPenalty(f32),
    #[error("--repetition-penalty must be a finite number > 0, got {0}")]
    RepetitionPenalty(f32),
    #[error("--logit-bias of token {token} must be between -100 and 100, got {bias}")]
    LogitBias { token: u32, bias: f32 },
    #[error("--logit-bias names token {token}, outside the vocabulary of {vocab} tokens")]
    LogitBiasId { token: u32, vocab: usize },
    #[error("token {token} is outside the {vocab} logits")]
    Token { token: u32, vocab: usize },
    #[error("no logits to sample from")]
    Empty,
    #[error("logit {index} is {value}: logits must be finite (or -inf for a masked token)")]
    NonFinite { index: usize, value: f32 },
    #[error("every one of the {0} logits is -inf")]
    AllMasked(usize),
}

/// How many of the most likely tokens top-p orders before it knows whether it needs them all.
const NUCLEUS_HEAD: usize = 1024;

/// Picks tokens from logits; holds the random state between calls.
#[derive(Debug, Clone)]
pub struct Sampler {
    params: SamplingParams,
    rng: Xoshiro256StarStar,
    /// (token, unnormalised probability), reused between calls.
    candidates: Vec<(u32, f64)>,
    /// The adjusted logits, reused between calls.
    adjusted: Vec<f32>,
    /// How often each token was chosen (kept only when a penalty is set).
    chosen: HashMap<u32, u32>,
}

impl Sampler {
    /// Checks the settings; the generator is seeded from `params.seed`.
    pub fn new(params: SamplingParams) -> Result<Self, SamplingError> {
        params.check()?;
        let rng = Xoshiro256StarStar::seed_from_u64(params.seed);
        Ok(Self { params, rng, candidates: Vec::new(), adjusted: Vec::new(), chosen: HashMap::new() })
    }

    pub fn params(&self) -> &SamplingParams {
        &self.params
    }

    /// The next token for `logits` (one per vocabulary entry), counted as chosen for the
    /// penalties of later calls.
    pub fn sample(&mut self, logits: &[f32]) -> Result<u32, SamplingError> {
        let token = if self.params.adjusts_logits() {
            let mut adjusted = std::mem::take(&mut self.adjusted);
            adjusted.clear();
            adjusted.extend_from_slice(logits);
            let token = self.adjust(&mut adjusted).and_then(|()| self.choose(&adjusted));
            self.adjusted = adjusted;
            token?
        } else {
            self.choose(logits)?
        };
        if self.params.penalises() {
            *self.chosen.entry(token).or_insert(0) += 1;
        }
        Ok(token)
    }

    /// `logit_bias` added, then for every token chosen so far (`n` times) the repetition
    /// penalty (divides a positive logit, multiplies one that is not), then `n *
    /// frequency_penalty + presence_penalty` subtracted: llama.cpp's and vLLM's order and
    /// formulas, OpenAI's for the last two.
    fn adjust(&self, logits: &mut [f32]) -> Result<(), SamplingError> {
        let vocab = logits.len();
        for &(token, bias) in &self.params.logit_bias {
            *logits.get_mut(token as usize).ok_or(SamplingError::LogitBiasId { token, vocab })? += bias;
        }
        let p = &self.params;
        for (&token, &n) in &self.chosen {
            let Some(logit) = logits.get_mut(token as usize) else { continue };
            if p.repetition_penalty != 1.0 {
                *logit = if *logit > 0.0 { *logit / p.repetition_penalty } else { *logit * p.repetition_penalty };
            }
            *logit -= n as f32 * p.frequency_penalty + p.presence_penalty;
        }
        Ok(())
    }

    /// The token for `logits` as they are to be used: argmax at temperature 0, else a draw.
    fn choose(&mut self, logits: &[f32]) -> Result<u32, SamplingError> {
        let best = argmax(logits)?;
        if self.params.temperature == 0.0 {
            return Ok(best);
        }
        let max = f64::from(logits[best as usize]);
        let inv_t = 1.0 / f64::from(self.params.temperature);
        // Softmax numerators in f64; tokens whose probability underflows to 0 cannot be drawn.
        self.candidates.clear();
        self.candidates.extend(logits.iter().enumerate().filter_map(|(i, &l)| {
            let w = ((f64::from(l) - max) * inv_t).exp();
            // Vocabularies are far below 2^32 entries, and the slice index came from enumerate.
            (w > 0.0).then_some((i as u32, w))
        }));
        // Most likely first, ties to the lower id, so filtering and the draw are deterministic.
        let by_probability = |a: &(u32, f64), b: &(u32, f64)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if let Some(k) = self.params.top_k {
            if k < self.candidates.len() {
                self.candidates.select_nth_unstable_by(k - 1, by_probability);
                self.candidates.truncate(k);
            }
            // Sorting the survivors also fixes their order, so the sums below do not depend on
            // how select_nth_unstable left them.
            self.candidates.sort_unstable_by(by_probability);
        }
        if let Some(p) = self.params.top_p {
            let total: f64 = self.candidates.iter().map(|c| c.1).sum();
            let target = f64::from(p) * total;
            let len = self.candidates.len();
            // The nucleus is usually a few hundred tokens: order the best NUCLEUS_HEAD first
            // and sort the rest only when the nucleus runs past them (same result as a full sort,
            // the order being total).
            let head = NUCLEUS_HEAD.min(len);
            if self.params.top_k.is_none() {
                if head < len {
                    self.candidates.select_nth_unstable_by(head - 1, by_probability);
                }
                self.candidates[..head].sort_unstable_by(by_probability);
            }
            let mut cumulative = 0.0;
            let mut keep = len;
            for n in 0..len {
                if n == head && self.params.top_k.is_none() {
                    self.candidates[head..].sort_unstable_by(by_probability);
                }
                cumulative += self.candidates[n].1;
                if cumulative >= target {
                    keep = n + 1;
                    break;
                }
            }
            self.candidates.truncate(keep);
        }
        // The best token's weight is exactly 1 (exp(0)), so min-p keeps those of weight at
        // least min_p; the best always stays.
        if let Some(min_p) = self.params.min_p {
            let min = f64::from(min_p);
            self.candidates.retain(|c| c.1 >= min);
        }
        let total: f64 = self.candidates.iter().map(|c| c.1).sum();
        let mut remaining = self.rng.next_f64() * total;
        for &(token, w) in &self.candidates {
            if remaining < w {
                return Ok(token);
            }
            remaining -= w;
        }
        // Rounding can leave a sliver past the last candidate: it belongs to the last one.
        Ok(self.candidates.last().map_or(best, |c| c.0))
    }
}

/// Index of the largest logit, the lowest index on ties; rejects NaN and +inf.
pub fn argmax(logits: &[f32]) -> Result<u32, SamplingError> {
    let mut best: Option<(usize, f32)> = None;
    for (index, &value) in logits.iter().enumerate() {
        if value.is_nan() || value == f32::INFINITY {
            return Err(SamplingError::NonFinite { index, value });
        }
        if value > f32::NEG_INFINITY && best.is_none_or(|(_, b)| value > b) {
            best = Some((index, value));
        }
    }
    match best {
        // Vocabularies are far below 2^32 entries.
        Some((index, _)) => Ok(index as u32),
        None if logits.is_empty() => Err(SamplingError::Empty),
        None => Err(SamplingError::AllMasked(logits.len())),
    }
}

/// Most `top` alternatives [`logprobs`] gives per token (OpenAI's limit for `top_logprobs`).
pub const MAX_TOP_LOGPROBS: usize = 20;

/// A chosen token's log-probability under the model's distribution, and the most likely
/// tokens' (most likely first, the lower id first on ties).
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprobs {
    pub token: u32,
    pub logprob: f32,
    pub top: Vec<(u32, f32)>,
}

/// The log-softmax of `logits` (the model's distribution: before bias, penalties,
/// temperature and filtering) at `token`, and at the `top` most likely ids (masked ids, at
/// -inf, left out). Sums in f64.
pub fn logprobs(logits: &[f32], token: u32, top: usize) -> Result<TokenLogprobs, SamplingError> {
    let best = argmax(logits)?;
    let max = f64::from(logits[best as usize]);
    let sum: f64 = logits.iter().map(|&l| (f64::from(l) - max).exp()).sum();
    let log_total = max + sum.ln();
    let logprob = |l: f32| (f64::from(l) - log_total) as f32;
    let chosen = *logits.get(token as usize).ok_or(SamplingError::Token { token, vocab: logits.len() })?;
    let mut ranked: Vec<(u32, f32)> = Vec::new();
    if top > 0 {
        // Vocabularies are far below 2^32 entries.
        ranked.extend(logits.iter().enumerate().filter(|(_, l)| **l > f32::NEG_INFINITY).map(|(i, &l)| (i as u32, l)));
        let order = |a: &(u32, f32), b: &(u32, f32)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if top < ranked.len() {
            ranked.select_nth_unstable_by(top - 1, order);
            ranked.truncate(top);
        }
        ranked.sort_unstable_by(order);
        for entry in &mut ranked {
            entry.1 = logprob(entry.1);
        }
    }
    Ok(TokenLogprobs { token, logprob: logprob(chosen), top: ranked })
}

/// SplitMix64 (Steele, Lea, Flood 2014; Vigna's reference `splitmix64.c`): expands a 64-bit
/// seed into well-mixed words for seeding the main generator.
#[derive(Debug, Clone)]
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
}

/// xoshiro256** 1.0 (Blackman and Vigna 2018, reference `xoshiro256starstar.c`): fast,
/// 256-bit state, passes BigCrush; seeded through SplitMix64 as its authors recommend.
#[derive(Debug, Clone)]
struct Xoshiro256StarStar([u64; 4]);

impl Xoshiro256StarStar {
    fn seed_from_u64(seed: u64) -> Self {
        let mut sm = SplitMix64(seed);
        // SplitMix64 never yields four zero words in a row, so the state is never all zero.
        Self([sm.next_u64(), sm.next_u64(), sm.next_u64(), sm.next_u64()])
    }

    fn next_u64(&mut self) -> u64 {
        let s = &mut self.0;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }

    /// Uniform in [0, 1) from the top 53 bits.
    fn next_f64(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sampler(temperature: f32, top_k: Option<usize>, top_p: Option<f32>, seed: u64) -> Sampler {
        Sampler::new(SamplingParams { temperature, top_k, top_p, seed, ..SamplingParams::default() }).unwrap()
    }

    fn softmax(logits: &[f32], t: f64) -> Vec<f64> {
        let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
        let w: Vec<f64> = logits.iter().map(|&l| ((l as f64 - max) / t).exp()).collect();
        let s: f64 = w.iter().sum();
        w.iter().map(|x| x / s).collect()
    }

    fn frequencies(s: &mut Sampler, logits: &[f32], draws: usize) -> Vec<f64> {
        let mut counts = vec![0usize; logits.len()];
        for _ in 0..draws {
            counts[s.sample(logits).unwrap() as usize] += 1;
        }
        counts.iter().map(|&c| c as f64 / draws as f64).collect()
    }

    #[test]
    fn reference_generator_outputs() {
        // Vigna's splitmix64.c with seed 1234567.
        let mut sm = SplitMix64(1_234_567);
        let got: Vec<u64> = (0..5).map(|_| sm.next_u64()).collect();
        assert_eq!(
            got,
            [6457827717110365317, 3203168211198807973, 9817491932198370423, 4593380528125082431, 16408922859458223821]
        );
        // xoshiro256starstar.c with state {1, 2, 3, 4}.
        let mut x = Xoshiro256StarStar([1, 2, 3, 4]);
        let got: Vec<u64> = (0..6).map(|_| x.next_u64()).collect();
        assert_eq!(got, [11520, 0, 1509978240, 1215971899390074240, 1216172134540287360, 607988272756665600]);
        // Seeding is part of the reproducibility contract: the first draws of seed 42.
        // (computed with an independent Python transcription of the two reference programs).
        let mut x = Xoshiro256StarStar::seed_from_u64(42);
        let got: Vec<u64> = (0..3).map(|_| x.next_u64()).collect();
        assert_eq!(got, [1546998764402558742, 6990951692964543102, 12544586762248559009]);
    }

    #[test]
    fn greedy_is_argmax_with_lowest_index_on_ties() {
        let mut s = sampler(0.0, None, None, 1);
        assert_eq!(s.sample(&[0.1, 3.0, -2.0, 2.9]).unwrap(), 1);
        assert_eq!(s.sample(&[0.5, 7.0, 7.0, 7.0, 1.0]).unwrap(), 1);
        assert_eq!(s.sample(&[f32::NEG_INFINITY, -1e30, f32::NEG_INFINITY]).unwrap(), 1);
        assert_eq!(s.sample(&[4.0]).unwrap(), 0);
        // Greedy ignores top-k/top-p and the seed.
        let mut other = sampler(0.0, Some(3), Some(0.5), 99);
        assert_eq!(other.sample(&[0.5, 7.0, 7.0, 7.0, 1.0]).unwrap(), 1);
    }

    #[test]
    fn top_k_one_is_greedy_at_any_temperature() {
        let logits: Vec<f32> = (0..1000).map(|i| ((i * 7919) % 1000) as f32 / 100.0).collect();
        let greedy = argmax(&logits).unwrap();
        let tied = [1.0, 5.0, 2.0, 5.0];
        for (t, seed) in [(0.1, 0), (1.0, 1), (5.0, 2), (100.0, 3)] {
            let mut s = sampler(t, Some(1), None, seed);
            for _ in 0..50 {
                assert_eq!(s.sample(&logits).unwrap(), greedy);
                assert_eq!(s.sample(&tied).unwrap(), 1);
            }
        }
    }

    #[test]
    fn seeds_reproduce_and_differ() {
        let flat = vec![0.0f32; 64];
        let run = |seed| {
            let mut s = sampler(1.0, None, None, seed);
            (0..200).map(|_| s.sample(&flat).unwrap()).collect::<Vec<u32>>()
        };
        assert_eq!(run(7), run(7));
        assert_ne!(run(7), run(8));
        assert_ne!(run(0), run(1));
        // All 64 tokens turn up in 200 flat draws (expected misses: 64 * (63/64)^200 = 0.27).
        let mut seen = run(7);
        seen.sort_unstable();
        seen.dedup();
        assert!(seen.len() >= 60, "{}", seen.len());
    }

    #[test]
    fn frequencies_match_softmax() {
        // 200k draws: one standard error is at most 0.0011; 0.005 is over 4 of them.
        let logits = [1.0, 2.0, 0.5, 3.0, -1.0];
        for t in [1.0f32, 0.5, 2.0] {
            let got = frequencies(&mut sampler(t, None, None, 1234), &logits, 200_000);
            let want = softmax(&logits, t as f64);
            for (g, w) in got.iter().zip(&want) {
                assert!((g - w).abs() < 0.005, "t={t}: got {got:?}, want {want:?}");
            }
        }
    }

    #[test]
    fn top_k_renormalises_over_the_k_best() {
        let logits = [1.0, 2.0, 0.5, 3.0, -1.0];
        let got = frequencies(&mut sampler(1.0, Some(2), None, 5), &logits, 100_000);
        let want = softmax(&[2.0, 3.0], 1.0);
        assert_eq!((got[0], got[2], got[4]), (0.0, 0.0, 0.0));
        assert!((got[1] - want[0]).abs() < 0.006 && (got[3] - want[1]).abs() < 0.006, "{got:?} vs {want:?}");
    }

    #[test]
    fn top_p_cuts_the_tail() {
        // Probabilities 0.5, 0.3, 0.15, 0.05: p = 0.9 keeps the first three (0.95 >= 0.9).
        let probs = [0.15f64, 0.5, 0.05, 0.3];
        let logits: Vec<f32> = probs.iter().map(|p| p.ln() as f32).collect();
        let got = frequencies(&mut sampler(1.0, None, Some(0.9), 11), &logits, 100_000);
        assert_eq!(got[2], 0.0, "the 5% token was drawn");
        for (i, p) in [(0, 0.15), (1, 0.5), (3, 0.3)] {
            assert!((got[i] - p / 0.95).abs() < 0.006, "{got:?}");
        }
        // p = 0.4 keeps only the top token.
        let got = frequencies(&mut sampler(1.0, None, Some(0.4), 11), &logits, 1000);
        assert_eq!(got[1], 1.0);

        // A tiny-probability token in a large vocabulary never appears.
        let mut logits = vec![0.0f32; 100];
        logits[42] = -12.0; // probability about 6e-8
        let mut s = sampler(1.0, None, Some(0.999), 3);
        assert!((0..20_000).all(|_| s.sample(&logits).unwrap() != 42));
    }

    /// The sampler written the slow, obvious way: full sort, then the same sums and draw.
    fn reference_sample(params: &SamplingParams, rng: &mut Xoshiro256StarStar, logits: &[f32]) -> u32 {
        let max = f64::from(logits[argmax(logits).unwrap() as usize]);
        let t = f64::from(params.temperature);
        let mut c: Vec<(u32, f64)> = logits
            .iter()
            .enumerate()
            .map(|(i, &l)| (i as u32, ((f64::from(l) - max) * (1.0 / t)).exp()))
            .filter(|c| c.1 > 0.0)
            .collect();
        let order = |a: &(u32, f64), b: &(u32, f64)| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0));
        if let Some(k) = params.top_k {
            c.sort_by(order);
            c.truncate(k);
        }
        if let Some(p) = params.top_p {
            let target = f64::from(p) * c.iter().map(|c| c.1).sum::<f64>();
            c.sort_by(order);
            let mut cum = 0.0;
            let keep = c.iter().position(|x| {
                cum += x.1;
                cum >= target
            });
            c.truncate(keep.map_or(c.len(), |n| n + 1));
        }
        if let Some(m) = params.min_p {
            c.retain(|x| x.1 >= f64::from(m));
        }
        let mut r = rng.next_f64() * c.iter().map(|c| c.1).sum::<f64>();
        for &(tok, w) in &c {
            if r < w {
                return tok;
            }
            r -= w;
        }
        c.last().unwrap().0
    }

    #[test]
    fn matches_the_plain_reference_on_a_large_vocabulary() {
        // 5000 tokens: a near-flat one (the nucleus outgrows NUCLEUS_HEAD) and a peaked one.
        let flat: Vec<f32> = (0..5000).map(|i| ((i * 7919 % 5000) as f32) / 5000.0).collect();
        let peaked: Vec<f32> = (0..5000).map(|i| -((i * 104_729 % 5000) as f32) / 50.0).collect();
        for logits in [&flat, &peaked] {
            for (temperature, top_k, top_p, min_p) in [
                (1.0, None, Some(0.95), None),
                (0.7, None, Some(0.5), None),
                (1.3, Some(2000), Some(0.9), None),
                (1.0, Some(40), None, None),
                (0.8, None, None, None),
                (1.0, None, None, Some(0.05)),
                (1.2, Some(500), Some(0.9), Some(0.2)),
            ] {
                let params = SamplingParams { temperature, top_k, top_p, min_p, seed: 77, ..SamplingParams::default() };
                let mut s = Sampler::new(params.clone()).unwrap();
                let mut rng = Xoshiro256StarStar::seed_from_u64(77);
                for step in 0..300 {
                    let want = reference_sample(&params, &mut rng, logits);
                    assert_eq!(s.sample(logits).unwrap(), want, "{params:?} step {step}");
                }
            }
        }
    }

    #[test]
    fn bad_settings_are_errors_naming_the_flag() {
        let err = |temperature, top_k, top_p| {
            Sampler::new(SamplingParams { temperature, top_k, top_p, ..SamplingParams::default() })
                .unwrap_err()
                .to_string()
        };
        assert_eq!(err(-0.5, None, None), "--temperature must be a finite number >= 0, got -0.5");
        assert_eq!(err(f32::NAN, None, None), "--temperature must be a finite number >= 0, got NaN");
        assert_eq!(err(f32::INFINITY, None, None), "--temperature must be a finite number >= 0, got inf");
        assert_eq!(err(1.0, None, Some(0.0)), "--top-p must be greater than 0 and at most 1, got 0");
        assert_eq!(err(1.0, None, Some(1.5)), "--top-p must be greater than 0 and at most 1, got 1.5");
        assert_eq!(err(1.0, None, Some(f32::NAN)), "--top-p must be greater than 0 and at most 1, got NaN");
        assert_eq!(err(1.0, Some(0), None), "--top-k must be at least 1, got 0");
        assert!(Sampler::new(SamplingParams { top_k: Some(1), top_p: Some(1.0), ..SamplingParams::default() }).is_ok());
        let bad = |change: fn(&mut SamplingParams)| {
            let mut params = SamplingParams::default();
            change(&mut params);
            Sampler::new(params).unwrap_err().to_string()
        };
        assert_eq!(bad(|p| p.min_p = Some(1.5)), "--min-p must be between 0 and 1, got 1.5");
        assert_eq!(bad(|p| p.presence_penalty = -2.5), "--presence-penalty must be between -2 and 2, got -2.5");
        assert_eq!(bad(|p| p.frequency_penalty = 3.0), "--frequency-penalty must be between -2 and 2, got 3");
        assert_eq!(bad(|p| p.frequency_penalty = f32::NAN), "--frequency-penalty must be between -2 and 2, got NaN");
        assert_eq!(bad(|p| p.repetition_penalty = 0.0), "--repetition-penalty must be a finite number > 0, got 0");
        assert_eq!(
            bad(|p| p.logit_bias = vec![(3, 101.0)]),
            "--logit-bias of token 3 must be between -100 and 100, got 101"
        );
        let biased = SamplingParams { logit_bias: vec![(3, 5.0), (9, -1.0)], ..SamplingParams::default() };
        assert_eq!(biased.check_vocab(10), Ok(()));
        assert_eq!(
            biased.check_vocab(9).unwrap_err().to_string(),
            "--logit-bias names token 9, outside the vocabulary of 9 tokens"
        );
    }

    #[test]
    fn bad_logits_are_errors() {
        let mut s = sampler(1.0, None, None, 0);
        assert_eq!(s.sample(&[]).unwrap_err().to_string(), "no logits to sample from");
        assert_eq!(
            s.sample(&[0.0, f32::NAN]).unwrap_err().to_string(),
            "logit 1 is NaN: logits must be finite (or -inf for a masked token)"
        );
        assert_eq!(
            s.sample(&[f32::INFINITY]).unwrap_err().to_string(),
            "logit 0 is inf: logits must be finite (or -inf for a masked token)"
        );
        assert_eq!(s.sample(&[f32::NEG_INFINITY; 3]).unwrap_err().to_string(), "every one of the 3 logits is -inf");
        // Masked tokens are never drawn.
        let logits = [0.0, f32::NEG_INFINITY, 0.0];
        assert!((0..1000).all(|_| s.sample(&logits).unwrap() != 1));
    }

    /// Greedy choices under `params` for `steps` calls on the same logits.
    fn greedy_run(params: SamplingParams, logits: &[f32], steps: usize) -> Vec<u32> {
        let mut s = Sampler::new(params).unwrap();
        (0..steps).map(|_| s.sample(logits).unwrap()).collect()
    }

    #[test]
    fn penalties_count_the_chosen_tokens() {
        let logits = [2.0, 1.5, 0.0];
        assert_eq!(greedy_run(SamplingParams::default(), &logits, 5), [0, 0, 0, 0, 0]);
        // Frequency 0.3: token 0 at 2.0, 1.7, 1.4 after 0, 1, 2 choices; token 1 at 1.5, 1.2.
        let frequency = SamplingParams { frequency_penalty: 0.3, ..SamplingParams::default() };
        assert_eq!(greedy_run(frequency, &logits, 5), [0, 0, 1, 0, 1]);
        // Presence 0.6: once chosen, token 0 is at 1.4 and token 1 at 0.9, however often.
        let presence = SamplingParams { presence_penalty: 0.6, ..SamplingParams::default() };
        assert_eq!(greedy_run(presence, &logits, 5), [0, 1, 0, 0, 0]);
        // A negative presence penalty keeps choosing what was chosen.
        let sticky = SamplingParams { presence_penalty: -0.5, ..SamplingParams::default() };
        assert_eq!(greedy_run(sticky, &[1.0, 1.2], 3), [1, 1, 1]);
        // Repetition 2: a positive logit halves (2.0 -> 1.0), a negative one doubles.
        let repetition = SamplingParams { repetition_penalty: 2.0, ..SamplingParams::default() };
        assert_eq!(greedy_run(repetition.clone(), &logits, 4), [0, 1, 0, 0]);
        assert_eq!(greedy_run(repetition, &[-1.0, -1.5], 3), [0, 1, 0]);
        // Both kinds: repetition first (2.0 / 1.25 = 1.6), then 1 * 0.3 off: 1.3 < 1.5.
        let both = SamplingParams { repetition_penalty: 1.25, frequency_penalty: 0.3, ..SamplingParams::default() };
        assert_eq!(greedy_run(both, &logits, 2), [0, 1]);
        // Sampled answers are penalised too: on a peaked distribution the favourite is drawn
        // far less often once its every choice costs it.
        let peaked = [4.0, 0.0, 0.0, 0.0];
        let favourite = |frequency_penalty: f32| {
            let params = SamplingParams { temperature: 1.0, frequency_penalty, seed: 3, ..SamplingParams::default() };
            let mut s = Sampler::new(params).unwrap();
            (0..40).filter(|_| s.sample(&peaked).unwrap() == 0).count()
        };
        let (free, penalised) = (favourite(0.0), favourite(2.0));
        assert!(free >= 30 && penalised <= 20, "{free} vs {penalised}");
    }

    #[test]
    fn logit_bias_forces_and_bans() {
        let logits = [5.0, 0.0, 1.0];
        let force = SamplingParams { temperature: 1.0, logit_bias: vec![(1, 100.0)], ..SamplingParams::default() };
        let mut s = Sampler::new(force).unwrap();
        assert!((0..1000).all(|_| s.sample(&logits).unwrap() == 1));
        let ban = SamplingParams { logit_bias: vec![(0, -100.0)], ..SamplingParams::default() };
        assert_eq!(greedy_run(ban, &logits, 3), [2, 2, 2]);
        // The logits passed in are not changed.
        assert_eq!(logits, [5.0, 0.0, 1.0]);
        // An id past the logits is an error, not a panic.
        let far = SamplingParams { logit_bias: vec![(7, 1.0)], ..SamplingParams::default() };
        assert_eq!(
            Sampler::new(far).unwrap().sample(&logits).unwrap_err(),
            SamplingError::LogitBiasId { token: 7, vocab: 3 }
        );
    }

    #[test]
    fn min_p_keeps_tokens_near_the_best() {
        // Probabilities 0.5, 0.3, 0.15, 0.05: min_p 0.5 keeps those of at least 0.25.
        let probs = [0.5f64, 0.15, 0.3, 0.05];
        let logits: Vec<f32> = probs.iter().map(|p| p.ln() as f32).collect();
        let params = SamplingParams { temperature: 1.0, min_p: Some(0.5), seed: 4, ..SamplingParams::default() };
        let got = frequencies(&mut Sampler::new(params).unwrap(), &logits, 100_000);
        assert_eq!((got[1], got[3]), (0.0, 0.0), "{got:?}");
        assert!((got[0] - 0.625).abs() < 0.006 && (got[2] - 0.375).abs() < 0.006, "{got:?}");
        // min_p 1 keeps only the best; 0 keeps everything.
        let only = SamplingParams { temperature: 1.0, min_p: Some(1.0), ..SamplingParams::default() };
        assert_eq!(frequencies(&mut Sampler::new(only).unwrap(), &logits, 500)[0], 1.0);
    }

    #[test]
    fn logprobs_are_the_log_softmax() {
        let logits = [1.0f32, 2.0, 0.5, f32::NEG_INFINITY, 2.0];
        let total = (1.0f64.exp() + 2.0f64.exp() + 0.5f64.exp() + 2.0f64.exp()).ln();
        let want = |l: f64| (l - total) as f32;
        let got = logprobs(&logits, 0, 3).unwrap();
        assert_eq!(got.token, 0);
        assert!((got.logprob - want(1.0)).abs() < 1e-6, "{got:?}");
        // Most likely first, the lower id first on ties.
        assert_eq!(got.top.iter().map(|t| t.0).collect::<Vec<_>>(), [1, 4, 0]);
        for (token, logprob) in &got.top {
            assert!((logprob - want(f64::from(logits[*token as usize]))).abs() < 1e-6, "{got:?}");
        }
        // More asked than there are tokens: the masked one is left out.
        assert_eq!(logprobs(&logits, 2, 20).unwrap().top.len(), 4);
        assert!(logprobs(&logits, 2, 0).unwrap().top.is_empty());
        // Large logits do not overflow.
        let big = logprobs(&[1000.0, 1000.0], 1, 1).unwrap();
        assert!((big.logprob - 0.5f32.ln()).abs() < 1e-6, "{big:?}");
        assert_eq!(logprobs(&logits, 5, 1).unwrap_err(), SamplingError::Token { token: 5, vocab: 5 });
    }
}
