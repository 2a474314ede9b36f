//! Choosing the next token from f32 logits: greedy, temperature, top-k, top-p, repetition
//! penalty, seeded. Runs on the host over one row of logits.

use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct SamplingParams {
    /// 0 means greedy (argmax, ties to the lower id).
    pub temperature: f32,
    /// Keep the k most likely tokens; 0 disables.
    pub top_k: usize,
    /// Keep the smallest set whose probability reaches p; 1 disables.
    pub top_p: f32,
    /// > 1 discourages tokens already in the context (CTRL / HF convention).
    pub repetition_penalty: f32,
    pub seed: u64,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams { temperature: 0.0, top_k: 0, top_p: 1.0, repetition_penalty: 1.0, seed: 0 }
    }
}

#[derive(Debug, thiserror::Error, PartialEq)]
pub enum SamplingError {
    #[error("temperature must be >= 0 and finite, got {0}")]
    Temperature(f32),
    #[error("top-p must be in (0, 1], got {0}")]
    TopP(f32),
    #[error("repetition penalty must be > 0 and finite, got {0}")]
    Penalty(f32),
    #[error("the logits are empty or all NaN")]
    NoCandidates,
}

impl SamplingParams {
    pub fn validate(&self) -> Result<(), SamplingError> {
        if !(self.temperature >= 0.0 && self.temperature.is_finite()) {
            return Err(SamplingError::Temperature(self.temperature));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(SamplingError::TopP(self.top_p));
        }
        if !(self.repetition_penalty > 0.0 && self.repetition_penalty.is_finite()) {
            return Err(SamplingError::Penalty(self.repetition_penalty));
        }
        Ok(())
    }
}

/// A sampler holds the random stream so a seeded generation is reproducible token by token.
pub struct Sampler {
    pub params: SamplingParams,
    rng: ChaCha8Rng,
}

impl Sampler {
    pub fn new(params: SamplingParams) -> Result<Sampler, SamplingError> {
        params.validate()?;
        let rng = ChaCha8Rng::seed_from_u64(params.seed);
        Ok(Sampler { params, rng })
    }

    /// Picks the next token given the logits and the ids already in the context.
    pub fn sample(&mut self, logits: &[f32], history: &[u32]) -> Result<u32, SamplingError> {
        let p = &self.params;
        let mut logits = logits.to_vec();
        if p.repetition_penalty != 1.0 {
            let mut seen = std::collections::HashSet::new();
            for &t in history {
                if let Some(l) = logits.get_mut(t as usize) {
                    if seen.insert(t) {
                        *l = if *l > 0.0 { *l / p.repetition_penalty } else { *l * p.repetition_penalty };
                    }
                }
            }
        }
        if p.temperature == 0.0 {
            return argmax(&logits).ok_or(SamplingError::NoCandidates);
        }
        // Candidates sorted by logit (descending), ties to the lower id; NaN never wins.
        let mut cand: Vec<(u32, f32)> =
            logits.iter().enumerate().filter(|(_, l)| !l.is_nan()).map(|(i, &l)| (i as u32, l)).collect();
        if cand.is_empty() {
            return Err(SamplingError::NoCandidates);
        }
        cand.sort_by(|a, b| b.1.total_cmp(&a.1).then(a.0.cmp(&b.0)));
        if p.top_k > 0 {
            cand.truncate(p.top_k);
        }
        let max = cand[0].1;
        let mut probs: Vec<f64> = cand.iter().map(|&(_, l)| (((l - max) / p.temperature) as f64).exp()).collect();
        let total: f64 = probs.iter().sum();
        probs.iter_mut().for_each(|x| *x /= total);
        if p.top_p < 1.0 {
            let mut acc = 0.0;
            let mut keep = probs.len();
            for (i, &x) in probs.iter().enumerate() {
                acc += x;
                if acc >= p.top_p as f64 {
                    keep = i + 1;
                    break;
                }
            }
            probs.truncate(keep);
            let total: f64 = probs.iter().sum();
            probs.iter_mut().for_each(|x| *x /= total);
        }
        let r: f64 = self.rng.random();
        let mut acc = 0.0;
        for (i, &x) in probs.iter().enumerate() {
            acc += x;
            if r < acc {
                return Ok(cand[i].0);
            }
        }
        Ok(cand[probs.len() - 1].0)
    }
}

/// Index of the largest value, ties to the lower index; NaN is skipped.
pub fn argmax(v: &[f32]) -> Option<u32> {
    let mut best: Option<(usize, f32)> = None;
    for (i, &x) in v.iter().enumerate() {
        if x.is_nan() {
            continue;
        }
        if best.is_none_or(|(_, b)| x > b) {
            best = Some((i, x));
        }
    }
    best.map(|(i, _)| i as u32)
}

/// log(sum(exp(logits))) of one row, in f64.
pub fn log_sum_exp(logits: &[f32]) -> f64 {
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max) as f64;
    logits.iter().map(|&l| (l as f64 - max).exp()).sum::<f64>().ln() + max
}

/// log-softmax of entry `i` of one row (for `k31 score`: no vocabulary-sized vector per token).
pub fn log_prob(logits: &[f32], i: usize) -> f64 {
    logits[i] as f64 - log_sum_exp(logits)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn greedy_is_argmax_with_low_id_ties() {
        let mut s = Sampler::new(SamplingParams::default()).expect("params");
        assert_eq!(s.sample(&[0.1, 3.0, 3.0, -1.0], &[]), Ok(1));
        assert_eq!(s.sample(&[f32::NAN, 1.0], &[]), Ok(1));
        assert_eq!(s.sample(&[], &[]), Err(SamplingError::NoCandidates));
    }

    #[test]
    fn repetition_penalty_lowers_seen_tokens() {
        let params = SamplingParams { repetition_penalty: 2.0, ..Default::default() };
        let mut s = Sampler::new(params).expect("params");
        // 3.0 / 2 = 1.5 < 2.0: token 1 loses to token 2 once it has been seen.
        assert_eq!(s.sample(&[0.0, 3.0, 2.0], &[1, 1]), Ok(2));
        // Negative logits are multiplied, so they drop further.
        assert_eq!(s.sample(&[-1.0, -1.5, -3.0], &[0]), Ok(1));
    }

    #[test]
    fn top_k_and_top_p_restrict_the_candidates() {
        let logits: Vec<f32> = (0..50).map(|i| i as f32 * 0.1).collect();
        let params = SamplingParams { temperature: 1.0, top_k: 3, seed: 9, ..Default::default() };
        let mut s = Sampler::new(params).expect("params");
        for _ in 0..200 {
            let t = s.sample(&logits, &[]).expect("token");
            assert!(t >= 47, "top-k 3 picked {t}");
        }
        let peaked = [10.0, 0.0, 0.0, 0.0];
        let params = SamplingParams { temperature: 1.0, top_p: 0.5, seed: 1, ..Default::default() };
        let mut s = Sampler::new(params).expect("params");
        assert!((0..100).all(|_| s.sample(&peaked, &[]) == Ok(0)));
    }

    #[test]
    fn seeded_sampling_is_reproducible_and_follows_the_distribution() {
        let logits = [0.0f32, (3f32).ln()]; // p = 0.25, 0.75
        let params = SamplingParams { temperature: 1.0, seed: 42, ..Default::default() };
        let run = || {
            let mut s = Sampler::new(params.clone()).expect("params");
            (0..4000).map(|_| s.sample(&logits, &[]).expect("token")).collect::<Vec<_>>()
        };
        let a = run();
        assert_eq!(a, run());
        let ones = a.iter().filter(|&&t| t == 1).count() as f64 / a.len() as f64;
        assert!((ones - 0.75).abs() < 0.03, "{ones}");
    }

    #[test]
    fn invalid_parameters_are_errors() {
        let bad = |p: SamplingParams| Sampler::new(p).err();
        assert!(bad(SamplingParams { temperature: -1.0, ..Default::default() }).is_some());
        assert!(bad(SamplingParams { top_p: 0.0, ..Default::default() }).is_some());
        assert!(bad(SamplingParams { repetition_penalty: f32::NAN, ..Default::default() }).is_some());
    }

    #[test]
    fn log_probs_normalise() {
        let row = [1.0, 2.0, 3.0, -1e30];
        let s: f64 = (0..row.len()).map(|i| log_prob(&row, i).exp()).sum();
        assert!((s - 1.0).abs() < 1e-12);
        assert!((log_prob(&row, 2) - log_prob(&row, 1) - 1.0).abs() < 1e-12);
    }
}
