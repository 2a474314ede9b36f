//! Text in, text out: prefill the prompt in chunks, then decode token by token with the
//! sampler, streaming text as it becomes valid UTF-8, stopping on EOS, a stop string or
//! the token budget. Also scoring (per-token log-probabilities of a given sequence).

use crate::gpu::Profiler;
use crate::layers::global_attn::{summarize, DiagnosticsSummary, TokenDiagnostics};
use crate::model::{Hooks, LogitsFor, Model, ModelError};
use crate::plan::PREFILL_CHUNK;
use crate::sample::{log_prob, Sampler};
use crate::session::Session;
use crate::trace::{self, SelectionSink};
use std::time::{Duration, Instant};

/// Why generation stopped.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub enum StopReason {
    Eos,
    StopString(String),
    MaxTokens,
    ContextFull,
}

/// Timings and sizes of one run, for `--metrics`.
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct Metrics {
    pub prompt_tokens: usize,
    pub generated_tokens: usize,
    pub prefill_seconds: f64,
    pub decode_seconds: f64,
    pub prefill_tokens_per_second: f64,
    pub decode_tokens_per_second: f64,
    /// Host time of the prefill and the decode spent building GPU pipelines (their first use
    /// in this process; the driver may also compile them for the first time on this machine).
    pub prefill_pipeline_seconds: f64,
    pub decode_pipeline_seconds: f64,
    pub cache_bytes: u64,
    /// Peak GPU memory the allocator reserved during the run (with --metrics, on backends
    /// that report it: Vulkan, DX12).
    pub peak_gpu_bytes: Option<u64>,
    pub kda_state_bytes: u64,
    /// GPU time per op family (from timestamp queries), seconds.
    pub gpu_seconds_by_op: Vec<(String, f64)>,
    /// Omitted-mass diagnostics per sparse global layer (when asked for).
    pub omitted_mass: Vec<DiagnosticsSummary>,
}

/// Everything a generation call can observe or control.
pub struct GenerateOptions<'a> {
    pub max_tokens: usize,
    pub stop_strings: Vec<String>,
    pub eos: Option<u32>,
    pub sink: Option<&'a mut dyn SelectionSink>,
    pub diagnostics: bool,
    pub profiler: Option<&'a mut Profiler>,
}

/// Runs `tokens` through the model in prefill chunks; returns the last token's logits.
pub fn prefill(
    model: &Model,
    session: &mut Session,
    tokens: &[u32],
    hooks: &mut Hooks<'_>,
) -> Result<Vec<f32>, ModelError> {
    if tokens.is_empty() {
        return Err(ModelError::Input("the prompt is empty: give at least one token".into()));
    }
    let mut last = Vec::new();
    for chunk in tokens.chunks(PREFILL_CHUNK) {
        last = model.forward(session, chunk, LogitsFor::Last, hooks)?.logits;
    }
    Ok(last)
}

/// Generates after `prompt` (already tokenised). `on_token(id)` is called for every new
/// token as it is chosen; the caller turns ids into text.
pub fn generate(
    model: &Model,
    session: &mut Session,
    prompt: &[u32],
    sampler: &mut Sampler,
    opts: &mut GenerateOptions<'_>,
    mut on_token: impl FnMut(u32) -> Option<StopReason>,
) -> Result<(Vec<u32>, StopReason, Metrics), ModelError> {
    if session.position + prompt.len() > model.max_context {
        return Err(ModelError::Input(format!(
            "the prompt has {} tokens but the context holds {} (already used: {})",
            prompt.len(),
            model.max_context,
            session.position
        )));
    }
    if prompt.is_empty() {
        return Err(ModelError::Input("the prompt is empty: give at least one token".into()));
    }
    let mut metrics = Metrics { prompt_tokens: prompt.len(), ..Default::default() };
    let mut diagnostics: Vec<TokenDiagnostics> = Vec::new();
    let built_before = model.gpu.pipelines.build_seconds();
    let t0 = Instant::now();
    let mut logits = Vec::new();
    for chunk in prompt.chunks(PREFILL_CHUNK) {
        let mut hooks = Hooks { sink: trace::reborrow(&mut opts.sink), diagnostics: opts.diagnostics, profiler: opts.profiler.as_deref_mut() };
        let f = model.forward(session, chunk, LogitsFor::Last, &mut hooks)?;
        diagnostics.extend(f.diagnostics);
        metrics.peak_gpu_bytes = metrics.peak_gpu_bytes.max(f.gpu_reserved_bytes);
        logits = f.logits;
    }

    metrics.prefill_seconds = t0.elapsed().as_secs_f64();
    let built_after_prefill = model.gpu.pipelines.build_seconds();
    metrics.prefill_pipeline_seconds = built_after_prefill - built_before;
    let mut out = Vec::new();
    let mut decode_time = Duration::ZERO;
    let reason = loop {
        if out.len() >= opts.max_tokens {
            break StopReason::MaxTokens;
        }
        let next = sampler.sample(&logits, &session.tokens).map_err(|e| ModelError::Input(e.to_string()))?;
        out.push(next);
        if Some(next) == opts.eos {
            break StopReason::Eos;
        }
        if let Some(r) = on_token(next) {
            break r;
        }
        if out.len() >= opts.max_tokens {
            break StopReason::MaxTokens;
        }
        if session.position >= model.max_context {
            break StopReason::ContextFull;
        }
        let t = Instant::now();
        let mut hooks = Hooks { sink: trace::reborrow(&mut opts.sink), diagnostics: opts.diagnostics, profiler: opts.profiler.as_deref_mut() };
        let f = model.forward(session, &[next], LogitsFor::Last, &mut hooks)?;
        decode_time += t.elapsed();
        diagnostics.extend(f.diagnostics);
        metrics.peak_gpu_bytes = metrics.peak_gpu_bytes.max(f.gpu_reserved_bytes);
        logits = f.logits;
    };
    metrics.generated_tokens = out.len();
    metrics.decode_seconds = decode_time.as_secs_f64();
    metrics.decode_pipeline_seconds = model.gpu.pipelines.build_seconds() - built_after_prefill;
    metrics.prefill_tokens_per_second = prompt.len() as f64 / metrics.prefill_seconds.max(1e-9);
    // The first token comes from the prefill logits; the others each cost a decode step.
    let steps = out.len().saturating_sub(1).max(1);
    metrics.decode_tokens_per_second = if out.len() > 1 { steps as f64 / metrics.decode_seconds.max(1e-9) } else { 0.0 };
    let mut layers: Vec<usize> = diagnostics.iter().map(|d| d.layer).collect();
    layers.sort();
    layers.dedup();
    metrics.omitted_mass = layers
        .into_iter()
        .map(|l| summarize(l, &diagnostics.iter().filter(|d| d.layer == l).cloned().collect::<Vec<_>>()))
        .collect();
    metrics.cache_bytes = session.cache_bytes();
    metrics.kda_state_bytes = session.kda_bytes();
    Ok((out, reason, metrics))
}

/// Log-probability of every token given the ones before it.
pub struct Scores {
    /// logprob[i] = log p(tokens[i+1] | tokens[..=i]).
    pub logprobs: Vec<f64>,
    pub perplexity: f64,
}

/// Scores `tokens` chunk by chunk. `on_logits` gets each chunk's logits rows [chunk, vocab] in
/// order (to dump them), so host memory holds one chunk's logits whatever the length: a whole
/// K3.1 text's [T, 163840] rows would be 655 KB per token.
pub fn score(
    model: &Model,
    session: &mut Session,
    tokens: &[u32],
    hooks: &mut Hooks<'_>,
    on_logits: &mut dyn FnMut(&[f32]) -> Result<(), ModelError>,
) -> Result<Scores, ModelError> {
    if tokens.is_empty() {
        return Err(ModelError::Input("nothing to score: the token list is empty".into()));
    }
    let vocab = model.config.vocab_size;
    let mut logprobs = Vec::with_capacity(tokens.len() - 1);
    for (c, chunk) in tokens.chunks(PREFILL_CHUNK).enumerate() {
        let logits = model.forward(session, chunk, LogitsFor::All, hooks)?.logits;
        on_logits(&logits)?;
        for (j, row) in logits.chunks(vocab).enumerate() {
            if let Some(&next) = tokens.get(c * PREFILL_CHUNK + j + 1) {
                logprobs.push(log_prob(row, next as usize));
            }
        }
    }
    let nll = -logprobs.iter().sum::<f64>() / logprobs.len().max(1) as f64;
    Ok(Scores { logprobs, perplexity: nll.exp() })
}
