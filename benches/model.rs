//! Whole-model decode and prefill on a checkpoint (the `k31-slice` preset: real K3.1
//! widths): per-layer-type decode time next to its bandwidth floor (weight bytes read /
//! copy bandwidth measured in the same run), prefill tokens/s, and the per-token decode
//! time of the full 93-layer K3.1 extrapolated from the measured layer types.
//! Run: `cargo bench --bench model -- --model DIR [--prompt-tokens N] [--decode-tokens N] [--json FILE] [--no-prewarm]`

use k31_engine::bench::copy_bandwidth;
use k31_engine::checkpoint::Checkpoint;
use k31_engine::config::ModelConfig;
use k31_engine::gpu::{Gpu, Profiler};
use k31_engine::layout::{expected_tensors, Role};
use k31_engine::model::{Hooks, LogitsFor, Model};
use std::collections::BTreeMap;

fn arg<T: std::str::FromStr>(args: &[String], name: &str) -> Option<T> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).and_then(|v| v.parse().ok())
}

/// Weight bytes one decode token reads per (layer, part), part = "mixer" or "ffn".
fn bytes_read(cfg: &ModelConfig) -> BTreeMap<(usize, &'static str), f64> {
    let mut m = BTreeMap::new();
    let frac = cfg.moe.as_ref().map_or(1.0, |e| e.experts_per_token as f64 / e.num_experts as f64);
    for t in expected_tensors(cfg) {
        let Some(l) = t.layer else { continue };
        let part = if t.name.contains(".self_attn.") { "mixer" } else if t.name.contains(".mlp.") || t.name.contains(".block_sparse_moe.") { "ffn" } else { continue };
        let b = t.canonical_bytes() as f64;
        let b = match t.role {
            Role::ExpertPacked | Role::ExpertScale | Role::ExpertDense => b * frac,
            _ => b,
        };
        *m.entry((l, part)).or_insert(0.0) += b;
    }
    m
}

/// The full K3.1 config, the model the slice's figures are extrapolated to.
fn k31_full() -> anyhow::Result<ModelConfig> {
    Ok(ModelConfig::from_json(&serde_json::from_str(include_str!("../models/configs/kimi-k3.1-pro.json"))?)?)
}

/// Per-scope GPU time against its floor, and the full 93-layer K3.1 extrapolated from the
/// time of each layer kind (layer 0 once, the mean of the others for the rest): ((GPU us,
/// floor us) per token, JSON rows).
fn extrapolate(cfg: &ModelConfig, copy: f64, per_scope: &[k31_engine::gpu::OpTime], steps: f64) -> anyhow::Result<((f64, f64), Vec<serde_json::Value>)> {
    let bytes = bytes_read(cfg);
    let mut rows = Vec::new();
    // Per kind: (layer, GPU us, floor us) of every layer part of that kind.
    let mut by_kind: BTreeMap<String, Vec<(Option<usize>, f64, f64)>> = BTreeMap::new();
    println!("{:<28} {:>10} {:>10} {:>8}", "layer part", "GPU us", "floor us", "x floor");
    for op in per_scope {
        let us = op.total_ns / steps / 1e3;
        let (floor_us, kind, layer) = match op.label.strip_prefix("layer").and_then(|r| r.split_once('.')) {
            Some((l, rest)) => {
                let l: usize = l.parse().unwrap_or(0);
                let part = if rest.starts_with("mixer") { "mixer" } else { "ffn" };
                (bytes.get(&(l, part)).copied().unwrap_or(0.0) / copy * 1e6, rest.to_string(), Some(l))
            }
            // The head reads lm_head; the embedding one row.
            None if op.label == "head" => ((cfg.vocab_size * cfg.hidden_size * 2) as f64 / copy * 1e6, op.label.clone(), None),
            None => ((cfg.hidden_size * 2) as f64 / copy * 1e6, op.label.clone(), None),
        };
        println!("{:<28} {:>10.1} {:>10.1} {:>8.2}", op.label, us, floor_us, if floor_us > 0.0 { us / floor_us } else { 0.0 });
        by_kind.entry(kind).or_default().push((layer, us, floor_us));
        rows.push(serde_json::json!({"scope": op.label, "gpu_us": us, "floor_us": floor_us}));
    }
    // Extrapolate to the full K3.1: per-type times x the counts of the real schedule.
    let full = k31_full()?;
    let count = |m: k31_engine::config::Mixer| full.count_mixer(m) as f64;
    // n layers of a kind: layer 0's part counted once as itself (it also holds the first
    // input norm, ~10 us), the other n - 1 as the mean of the slice's other layers of the kind.
    let extrapolated = |k: &str, n: f64| -> Option<(f64, f64)> {
        let parts = by_kind.get(k)?;
        let mean = |ps: &[&(Option<usize>, f64, f64)]| {
            let m = ps.len().max(1) as f64;
            (ps.iter().map(|p| p.1).sum::<f64>() / m, ps.iter().map(|p| p.2).sum::<f64>() / m)
        };
        let (first, rest): (Vec<_>, Vec<_>) = parts.iter().partition(|p| p.0 == Some(0));
        Some(match (first.first(), rest.is_empty()) {
            (Some(f), false) => {
                let (us, fl) = mean(&rest);
                (f.1 + us * (n - 1.0), f.2 + fl * (n - 1.0))
            }
            _ => {
                let (us, fl) = mean(&parts.iter().collect::<Vec<_>>());
                (us * n, fl * n)
            }
        })
    };
    let mut total = (0.0, 0.0);
    for (kind, n) in [
        ("mixer.kda", count(k31_engine::config::Mixer::Kda)),
        ("mixer.global", count(k31_engine::config::Mixer::Global)),
        ("ffn.dense", 1.0),
        ("ffn.moe", (full.num_layers() - 1) as f64),
        ("head", 1.0),
        ("embed", 1.0),
    ] {
        if let Some((us, fl)) = extrapolated(kind, n) {
            total.0 += us;
            total.1 += fl;
            println!("full K3.1: {kind:<14} x {n:>3}: {us:>9.1} us (floor {fl:>9.1} us)");
        }
    }
    Ok((total, rows))
}

/// Source counts of every AttnRes aggregation of a model (spec 3.2, block size S): layer l's
/// attention side sees ceil(l / S) bank entries plus the carry (none at l = 0), its MLP side
/// the bank after l's snapshot plus the partial, and the final norm ceil(L / S) + 1.
fn attn_res_points(cfg: &ModelConfig) -> Vec<usize> {
    let Some(s) = cfg.attn_res_block_size else { return Vec::new() };
    let l_n = cfg.num_layers();
    let mut n = Vec::with_capacity(2 * l_n + 1);
    for l in 0..l_n {
        if l > 0 {
            n.push(l.div_ceil(s) + 1);
        }
        n.push(l / s + 2);
    }
    n.push(l_n.div_ceil(s) + 1);
    n
}

/// The slice's AttnRes points see fewer sources than deep K3.1 layers, so the per-kind
/// extrapolation charges every K3.1 point at the slice's counts. Times one decode-token
/// aggregation (sums + mix + RMSNorm, d = hidden) per source count and prints what K3.1's
/// counts cost per token against the slice's: the extrapolation's under-count (ms).
fn attn_res_sources(gpu: &Gpu, cfg: &ModelConfig) -> anyhow::Result<f64> {
    use k31_engine::ops::attn_res;
    let (deep, slice) = (attn_res_points(&k31_full()?), attn_res_points(cfg));
    let Some(&max_n) = deep.iter().chain(&slice).max() else { return Ok(0.0) };
    let d = cfg.hidden_size;
    let bf16_ones = gpu.storage_from("attn_res bf16 vectors", &vec![0x3f80_3f80u32; d.div_ceil(2)]);
    let cur = gpu.storage_from("attn_res cur", &(0..d).map(|i| ((i % 29) as f32 - 14.0) * 0.01).collect::<Vec<f32>>());
    let bank = gpu.storage_from("attn_res bank", &(0..max_n * d).map(|i| ((i % 31) as f32 - 15.0) * 0.01).collect::<Vec<f32>>());
    let out = gpu.storage("attn_res out", (d * 4) as u64);
    let alpha = gpu.storage("attn_res alpha", (attn_res::alpha_len(1, d, max_n) * 4) as u64);
    let mut t_us = vec![0.0; max_n + 1];
    for (n, t) in t_us.iter_mut().enumerate().skip(2) {
        let sources = attn_res::Sources { bank: &bank, n_bank: n - 1, bank_stride: d, cur: &cur, add: None };
        let query = attn_res::Query { gamma: &bf16_ones, proj: &bf16_ones };
        *t = 1e6 * k31_engine::bench::time_gpu(gpu, 3, 30, |enc, prof| attn_res::attn_res_norm(gpu, enc, 1, d, 1e-6, sources, query, &bf16_ones, &out, &alpha, prof))?;
    }
    let row: Vec<String> = (2..=max_n).map(|n| format!("{n}: {:.1}", t_us[n])).collect();
    println!("AttnRes + RMSNorm per aggregation, one decode token, by sources (us, a pass each): {}", row.join(", "));
    // Every K3.1 point charged at the slice's mean count (what the per-kind extrapolation does)
    // against its own count.
    let slice_mean = slice.iter().map(|&n| t_us[n.max(2)]).sum::<f64>() / slice.len().max(1) as f64;
    let at_own: f64 = deep.iter().map(|&n| t_us[n.max(2)]).sum();
    let extra_ms = (at_own - slice_mean * deep.len() as f64) / 1e3;
    println!(
        "AttnRes: K3.1's {} aggregations at their own source counts (2-{max_n}) take {:.2} ms per token, {extra_ms:+.2} ms against the slice's counts",
        deep.len(),
        at_own / 1e3
    );
    Ok(extra_ms)
}

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let dir: String = arg(&args, "--model").ok_or_else(|| anyhow::anyhow!("--model DIR is required"))?;
    let prompt_n: usize = arg(&args, "--prompt-tokens").unwrap_or(512);
    let decode_n: usize = arg(&args, "--decode-tokens").unwrap_or(16);
    let json_out: Option<String> = arg(&args, "--json");
    let gpu = Gpu::open(None)?;
    println!("GPU: {}", gpu.describe());
    let copy = copy_bandwidth(&gpu, 1 << 30)?;
    println!("copy bandwidth: {:.1} GB/s", copy / 1e9);
    let ck = Checkpoint::open(std::path::Path::new(&dir))?;
    // As `k31 generate` does: every kernel compiles beside the weight upload (`--no-prewarm`:
    // the first prompt builds what it uses, one kernel after the other).
    let prewarm = !args.iter().any(|a| a == "--no-prewarm");
    let t = std::time::Instant::now();
    let load = || Model::load(gpu.clone(), &ck, prompt_n + 3 * decode_n + 8, &k31_engine::layers::load_ffn, |_, _| {});
    let (model, warmed) = if prewarm { k31_engine::ops::beside_prewarm(&gpu, load) } else { (load(), Some((0, 0.0))) };
    let model = model?;
    let (warmed, warm_s) = warmed.ok_or_else(|| anyhow::anyhow!("the pipeline prewarm thread panicked"))?;
    println!("loaded {} in {:.1} s ({warmed} pipelines prewarmed beside it in {warm_s:.2} s)", dir, t.elapsed().as_secs_f64());
    let cfg = model.config.clone();
    let ids: Vec<u32> = (0..prompt_n as u32).map(|i| (i * 7919 + 13) % cfg.vocab_size as u32).collect();

    // Prefill twice on fresh sessions: the first (cold) run also builds pipelines and grows the
    // scratch pool, as a process's first prompt does; the second is the steady state.
    let prefill = |run: &str| -> anyhow::Result<(k31_engine::session::Session, f64, f64)> {
        let mut s = model.new_session()?;
        let t = std::time::Instant::now();
        let mut host_s = 0.0;
        for chunk in ids.chunks(k31_engine::plan::PREFILL_CHUNK) {
            host_s += model.forward(&mut s, chunk, LogitsFor::Last, &mut Hooks::default())?.host_record_s;
        }
        let secs = t.elapsed().as_secs_f64();
        println!(
            "prefill {prompt_n} tokens ({run}): {secs:.3} s = {:.1} tokens/s ({host_s:.3} s of it recording and submitting on the host)",
            prompt_n as f64 / secs
        );
        Ok((s, secs, host_s))
    };
    let (_, prefill_cold_s, _) = prefill("cold")?;
    let (mut s, prefill_s, prefill_host_s) = prefill("warm")?;
    // Where prefill spends it: one chunk again on a fresh session, every pass timestamped.
    {
        let chunk = &ids[..prompt_n.min(k31_engine::plan::PREFILL_CHUNK)];
        let mut ps = model.new_session()?;
        let mut prof = Profiler::new(&gpu, 2048);
        model.forward(&mut ps, chunk, LogitsFor::Last, &mut Hooks { profiler: Some(&mut prof), ..Default::default() })?;
        let by_op = prof.report_by(|l| match l.strip_prefix("layer").and_then(|r| r.split_once('.')) {
            Some((_, rest)) => rest.to_string(),
            None => l.to_string(),
        });
        println!("prefill of {} tokens by kind/kernel (all layers of the kind), GPU ms ({} passes not timed):", chunk.len(), prof.dropped);
        for op in by_op.iter().take(30) {
            println!("  {:<48} {:>10.2}  ({} passes)", op.label, op.total_ns / 1e6, op.count);
        }
    }

    // `n` greedy decode steps from `next`, all but the first timed by `prof`; returns the next token.
    let profiled_decode = |s: &mut k31_engine::session::Session, mut next: u32, n: usize, prof: &mut Profiler| -> anyhow::Result<u32> {
        for i in 0..n {
            let profiler = if i > 0 { Some(&mut *prof) } else { None };
            let out = model.forward(s, &[next], LogitsFor::Last, &mut Hooks { profiler, ..Default::default() })?;
            next = k31_engine::sample::argmax(&out.logits).unwrap_or(0);
        }
        Ok(next)
    };
    // Decode with per-layer GPU time.
    let mut prof = Profiler::new(&gpu, 2048);
    let mut next = profiled_decode(&mut s, 1, decode_n, &mut prof)?;
    let steps = (decode_n - 1).max(1) as f64;
    // Wall clock without the profiler (its timestamps serialise every pass).
    let mut wall = Vec::new();
    let mut host = Vec::new();
    for _ in 0..decode_n {
        let t = std::time::Instant::now();
        let out = model.forward(&mut s, &[next], LogitsFor::Last, &mut Hooks::default())?;
        wall.push(t.elapsed().as_secs_f64());
        host.push(out.host_record_s);
        next = k31_engine::sample::argmax(&out.logits).unwrap_or(0);
    }
    wall.sort_by(f64::total_cmp);
    let wall_med = wall.get(wall.len() / 2).copied().unwrap_or(0.0);
    host.sort_by(f64::total_cmp);
    let host_med = host.get(host.len() / 2).copied().unwrap_or(0.0);
    // GPU time per layer part without per-pass stamps (each adds a few us): marks at the
    // scope boundaries only.
    let mut spans = Profiler::spans(&gpu, 1024);
    profiled_decode(&mut s, next, decode_n, &mut spans)?;
    let per_scope = prof.report_by(|l| l.split('/').next().unwrap_or(l).to_string());
    let (total, rows) = extrapolate(&cfg, copy, &per_scope, steps)?;
    // Where each layer kind spends it: kernels per kind (summed over the layers of the kind).
    let by_op = prof.report_by(|l| match l.strip_prefix("layer").and_then(|r| r.split_once('.')) {
        Some((_, rest)) => rest.to_string(),
        None => l.to_string(),
    });
    println!("{:<48} {:>10}", "kind/kernel (all layers of the kind)", "GPU us");
    for op in by_op.iter().take(40) {
        println!("{:<48} {:>10.1}  ({} passes/token)", op.label, op.total_ns / steps / 1e3, op.count as f64 / steps);
    }

    println!(
        "decode: wall {:.2} ms/token here; full 93-layer K3.1 extrapolated GPU time {:.2} ms/token vs floor {:.2} ms ({:.2}x)",
        wall_med * 1e3,
        total.0 / 1e3,
        total.1 / 1e3,
        if total.1 > 0.0 { total.0 / total.1 } else { 0.0 }
    );
    println!("decode: host recording and submitting {:.2} ms/token of the {:.2} ms wall", host_med * 1e3, wall_med * 1e3);
    println!("-- the same parts timed as spans between layer-boundary marks (no per-pass stamps) --");
    let (span_total, span_rows) = extrapolate(&cfg, copy, &spans.report(), steps)?;
    println!(
        "decode: full 93-layer K3.1 extrapolated from spans {:.2} ms/token vs floor {:.2} ms ({:.2}x)",
        span_total.0 / 1e3,
        span_total.1 / 1e3,
        if span_total.1 > 0.0 { span_total.0 / span_total.1 } else { 0.0 }
    );
    let attn_res_extra_ms = attn_res_sources(&gpu, &cfg)?;
    let corrected_ms = span_total.0 / 1e3 + attn_res_extra_ms;
    println!(
        "decode: full 93-layer K3.1 from spans, AttnRes at K3.1's source counts: {corrected_ms:.2} ms/token vs floor {:.2} ms ({:.2}x)",
        span_total.1 / 1e3,
        if span_total.1 > 0.0 { corrected_ms * 1e3 / span_total.1 } else { 0.0 }
    );
    if let Some(path) = json_out {
        let v = serde_json::json!({
            "attn_res_deep_extra_ms": attn_res_extra_ms,
            "gpu": gpu.describe(), "copy_gbs": copy / 1e9, "prefill_tokens": prompt_n, "prefill_s": prefill_s, "prefill_cold_s": prefill_cold_s, "prefill_host_s": prefill_host_s,
            "decode_wall_ms": wall_med * 1e3, "decode_host_ms": host_med * 1e3, "rows": rows,
            "full_model_decode_ms": total.0 / 1e3, "full_model_floor_ms": total.1 / 1e3,
            "span_rows": span_rows, "full_model_decode_spans_ms": span_total.0 / 1e3,
            "full_model_decode_spans_attn_res_ms": corrected_ms,
        });
        std::fs::write(path, serde_json::to_string_pretty(&v)?)?;
    }
    Ok(())
}
