//! `k31 generate` and `k31 score`: load a model, run it, print text or numbers.

use anyhow::{bail, Context, Result};
use clap::Args;
use k31_engine::checkpoint::Checkpoint;
use k31_engine::generate::{self, GenerateOptions, Metrics, StopReason};
use k31_engine::gpu::{Gpu, Profiler};
use k31_engine::model::{Hooks, Model, ModelError};
use k31_engine::ops::dsa::IndexPrecision;
use k31_engine::sample::{Sampler, SamplingParams};
use k31_engine::session::{self, Session};
use k31_engine::tokenizer::{Tokenizer, Utf8Stream};
use k31_engine::trace::{Selection, SelectionSink};
use k31_viewer::{run_window, spawn_png_export, Flow, FrameSink, GenControl, LayerFigures, PngExportOptions, TraceWriter, ViewerOptions};
use std::cell::RefCell;
use std::io::Write as _;
use std::path::{Path, PathBuf};
use std::rc::Rc;
use std::sync::Arc;

#[derive(Args, Clone, Debug)]
pub struct ModelArgs {
    /// Model directory: config.json, safetensors, tiktoken.model or tokenizer.json.
    #[arg(long)]
    pub model: PathBuf,
    /// Context length to allocate caches for (default: the smaller of the model's
    /// maximum and 32768).
    #[arg(long)]
    pub context: Option<usize>,
    /// Print prefill/decode speed, memory and GPU time per op family.
    #[arg(long)]
    pub metrics: bool,
    /// Precision of the sparse-attention indexer's query: f32 (as computed) or bf16 (rounded
    /// as the reference model's bf16 Linear outputs are; scores move ~1e-3 relative, which can
    /// change selections at the k-th boundary). Index keys are stored in bf16 either way.
    #[arg(long, default_value = "f32", value_name = "f32|bf16")]
    pub index_precision: IndexPrecision,
}

#[derive(Args, Clone, Debug)]
pub struct GenerateArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    #[arg(long)]
    pub prompt: String,
    #[arg(long, default_value_t = 64)]
    pub max_tokens: usize,
    /// 0 = greedy. (Negative numbers parse, so that the sampler names what is wrong.)
    #[arg(long, default_value_t = 0.0, allow_negative_numbers = true)]
    pub temperature: f32,
    /// 0 = no top-k cut.
    #[arg(long, default_value_t = 0)]
    pub top_k: usize,
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub top_p: f32,
    #[arg(long, default_value_t = 1.0, allow_negative_numbers = true)]
    pub repetition_penalty: f32,
    #[arg(long, default_value_t = 0)]
    pub seed: u64,
    /// Stop when this text appears (repeatable).
    #[arg(long = "stop")]
    pub stop: Vec<String>,
    /// Machine-readable output (one JSON object at the end).
    #[arg(long)]
    pub json: bool,
    /// Write every global layer's selected positions per token as JSON lines (docs/formats.md).
    #[arg(long)]
    pub selection_trace: Option<PathBuf>,
    /// Render the final selection heatmap to this PNG.
    #[arg(long)]
    pub selection_png: Option<PathBuf>,
    /// With --selection-png: also write a numbered frame every N tokens.
    #[arg(long, requires = "selection_png")]
    pub selection_png_every: Option<usize>,
    /// Also compute dense attention in the sparse layers and report, per layer and head,
    /// the softmax mass the selection omitted, the output error and the indexer's recall.
    #[arg(long)]
    pub omitted_mass: bool,
    /// Compute a shared prompt prefix once: if FILE holds a session snapshot whose tokens
    /// begin this prompt, restore it and run only the rest; otherwise run all but the last
    /// prompt token, save the session there (docs/formats.md), then continue.
    #[arg(long, value_name = "FILE")]
    pub prefix_cache: Option<PathBuf>,
}

#[derive(Args, Clone, Debug)]
pub struct ViewArgs {
    #[command(flatten)]
    pub generate: GenerateArgs,
    /// Close the window when generation ends (scripts and tests).
    #[arg(long)]
    pub exit_when_done: bool,
}

#[derive(Args, Clone, Debug)]
pub struct ScoreArgs {
    #[command(flatten)]
    pub model: ModelArgs,
    /// A UTF-8 text file to tokenise and score.
    #[arg(long, conflicts_with = "token_ids")]
    pub text: Option<PathBuf>,
    /// A JSON file holding a flat array of token ids, e.g. [312, 17, 5].
    #[arg(long)]
    pub token_ids: Option<PathBuf>,
    /// Write a safetensors file with `logits` [T, vocab] f32, one row per input position.
    #[arg(long)]
    pub dump_logits: Option<PathBuf>,
    #[arg(long)]
    pub json: bool,
}

struct Loaded {
    gpu: Arc<Gpu>,
    model: Model,
    tokenizer: Option<Tokenizer>,
}

fn load(args: &ModelArgs, adapter: Option<&str>, need_tokenizer: bool) -> Result<Loaded> {
    if !args.model.join("config.json").exists() {
        bail!("{} has no config.json: give a model directory (for a test model: `k31 init --preset tiny DIR`)", args.model.display());
    }
    let ck = Checkpoint::open(&args.model)?;
    let tokenizer = match Tokenizer::from_dir(&args.model) {
        Ok(t) => Some(t),
        Err(e) if need_tokenizer => return Err(e).context(format!("loading the tokenizer of {}", args.model.display())),
        Err(_) => None,
    };
    let gpu = Gpu::open(adapter)?;
    let context = args.context.unwrap_or(ck.config.max_position_embeddings.min(32768));
    if context == 0 || context > ck.config.max_position_embeddings {
        bail!("--context {context} must be in 1..={} (max_position_embeddings)", ck.config.max_position_embeddings);
    }
    let bar = indicatif::ProgressBar::new(0);
    bar.set_style(
        indicatif::ProgressStyle::with_template("loading {bar:40} {pos}/{len} layers {elapsed}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    // The kernels compile beside the weight upload instead of during the first prompt.
    let (model, _) = k31_engine::ops::beside_prewarm(&gpu, || {
        Model::load(gpu.clone(), &ck, context, &k31_engine::layers::load_ffn, |done, total| {
            bar.set_length(total as u64);
            bar.set_position(done as u64);
        })
    });
    let mut model = model?;
    model.index_precision = args.index_precision;
    bar.finish_and_clear();
    Ok(Loaded { gpu, model, tokenizer })
}

/// Fans selections out to the viewer frames and the trace file; shared with the per-token
/// callback (which closes each step) through `Rc<RefCell<..>>`.
#[derive(Default)]
struct Sinks {
    frames: Option<FrameSink>,
    trace: Option<TraceWriter>,
}

impl Sinks {
    fn any(&self) -> bool {
        self.frames.is_some() || self.trace.is_some()
    }
    fn end_step(&mut self, text: &dyn Fn(usize) -> String) {
        if let Some(f) = &mut self.frames {
            f.end_step(text);
        }
        if let Some(t) = &mut self.trace {
            t.end_step(text);
        }
    }
}

struct SharedSinks(Rc<RefCell<Sinks>>);

impl SelectionSink for SharedSinks {
    fn wants(&self, layer: usize) -> bool {
        let s = self.0.borrow();
        s.frames.as_ref().is_some_and(|f| f.wants(layer)) || s.trace.as_ref().is_some_and(|t| t.wants(layer))
    }
    fn record(&mut self, sel: Selection<'_>) {
        let mut s = self.0.borrow_mut();
        if let Some(f) = &mut s.frames {
            if f.wants(sel.layer) {
                f.record(sel);
            }
        }
        if let Some(t) = &mut s.trace {
            if t.wants(sel.layer) {
                t.record(sel);
            }
        }
    }
}

pub fn generate(args: GenerateArgs, adapter: Option<&str>) -> Result<()> {
    let loaded = load(&args.model, adapter, true)?;
    run_generation(args, loaded, None, None)
}

/// `k31 view`: generation on a worker thread, the window on this (main) thread.
pub fn view(args: ViewArgs, adapter: Option<&str>) -> Result<()> {
    let loaded = load(&args.generate.model, adapter, true)?;
    let (tx, rx) = std::sync::mpsc::channel();
    let (ctl_tx, ctl) = GenControl::channel();
    let gen_args = args.generate.clone();
    let worker = std::thread::spawn(move || run_generation(gen_args, loaded, Some(FrameSink::new(tx)), Some(ctl)));
    let opts = ViewerOptions { exit_when_done: args.exit_when_done, ..Default::default() };
    let summary = run_window(rx, Some(ctl_tx), opts);
    let generated = worker.join().map_err(|_| anyhow::anyhow!("the generation thread panicked"))?;
    let summary = summary?;
    eprintln!("viewer: {} frames drawn on {}", summary.frames_drawn, summary.adapter);
    generated
}

fn run_generation(args: GenerateArgs, loaded: Loaded, window: Option<FrameSink>, mut control: Option<GenControl>) -> Result<()> {
    let params = SamplingParams {
        temperature: args.temperature,
        top_k: args.top_k,
        top_p: args.top_p,
        repetition_penalty: args.repetition_penalty,
        seed: args.seed,
    };
    let mut sampler = Sampler::new(params)?;
    if args.prompt.is_empty() {
        bail!("the prompt is empty: give some text with --prompt");
    }
    let Loaded { gpu, model, tokenizer } = loaded;
    let tok = tokenizer.context("this model has no tokenizer")?;
    let prompt = tok.encode(&args.prompt, false)?;
    if prompt.is_empty() {
        bail!("the prompt encodes to no tokens");
    }
    if prompt.len() > model.max_context {
        bail!("the prompt is {} tokens but the context is {} (raise --context, up to max_position_embeddings)", prompt.len(), model.max_context);
    }
    let mut session = model.new_session()?;
    let feed = match &args.prefix_cache {
        Some(path) => use_prefix_cache(&gpu, &model, &mut session, &prompt, path)?,
        None => 0,
    };
    let mut profiler = args.model.metrics.then(|| Profiler::new(&gpu, 2048));

    let sinks = Rc::new(RefCell::new(Sinks::default()));
    let mut png_export = None;
    {
        let mut s = sinks.borrow_mut();
        s.frames = window;
        if let Some(path) = &args.selection_png {
            let mut o = PngExportOptions::new(path.clone());
            o.every = args.selection_png_every;
            let (tx, handle) = spawn_png_export(o);
            match &mut s.frames {
                Some(f) => f.add(tx),
                None => s.frames = Some(FrameSink::new(tx)),
            }
            png_export = Some(handle);
        }
        if let Some(path) = &args.selection_trace {
            s.trace = Some(TraceWriter::create(path)?);
        }
    }
    let mut shared = SharedSinks(sinks.clone());
    let listening = sinks.borrow().any();
    let mut opts = GenerateOptions {
        max_tokens: args.max_tokens,
        stop_strings: args.stop.clone(),
        eos: model.config.eos_token_id,
        sink: if listening { Some(&mut shared) } else { None },
        diagnostics: args.omitted_mass,
        profiler: profiler.as_mut(),
    };
    let mut stream = Utf8Stream::new();
    let mut text = String::new();
    let stdout = std::io::stdout();
    let json = args.json;
    let stops = args.stop.clone();
    let all_tokens = RefCell::new(prompt.clone());
    let token_text = |p: usize| all_tokens.borrow().get(p).and_then(|&id| tok.token_text(id).ok()).unwrap_or_default();
    let (ids, reason, mut metrics) = generate::generate(&model, &mut session, &prompt[feed..], &mut sampler, &mut opts, |id| {
        // Selections of the forward that produced this token are complete now.
        sinks.borrow_mut().end_step(&token_text);
        all_tokens.borrow_mut().push(id);
        let piece = tok.decode_bytes(&[id]).map(|b| stream.push(&b)).unwrap_or_default();
        text.push_str(&piece);
        if !json {
            let mut out = stdout.lock();
            let _ = out.write_all(piece.as_bytes());
            let _ = out.flush();
        }
        if let Some(c) = control.as_mut() {
            if c.next_step() == Flow::Stop {
                return Some(StopReason::MaxTokens);
            }
        }
        stops.iter().find(|s| text.contains(s.as_str())).map(|s| StopReason::StopString(s.clone()))
    })?;
    drop(opts);
    {
        let mut s = sinks.borrow_mut();
        s.end_step(&token_text);
        if let Some(f) = &mut s.frames {
            if args.omitted_mass {
                f.figures(figures(&metrics));
            }
            f.finish();
        }
        if let Some(t) = s.trace.take() {
            if args.omitted_mass {
                let mut t = t;
                t.write_figures(&figures(&metrics));
                t.finish()?;
            } else {
                t.finish()?;
            }
        }
    }
    if let Some(h) = png_export {
        h.join().map_err(|_| anyhow::anyhow!("the PNG export thread panicked"))??;
    }
    text.push_str(&stream.finish());
    if let StopReason::StopString(s) = &reason {
        if let Some(i) = text.find(s.as_str()) {
            text.truncate(i);
        }
    }
    if let Some(p) = profiler.as_mut() {
        p.collect(&gpu)?;
        metrics.gpu_seconds_by_op = p.report_by(op_family).into_iter().map(|t| (t.label, t.total_ns * 1e-9)).collect();
    }
    if json {
        let v = serde_json::json!({
            "prompt_tokens": prompt, "tokens": ids, "text": text, "stop_reason": reason,
            "metrics": if args.model.metrics { serde_json::to_value(&metrics)? } else { serde_json::Value::Null },
            "omitted_mass": if args.omitted_mass { serde_json::to_value(&metrics.omitted_mass)? } else { serde_json::Value::Null },
        });
        println!("{}", serde_json::to_string(&v)?);
    } else {
        println!();
        if args.model.metrics {
            print_metrics(&metrics);
        }
        if args.omitted_mass {
            print_omitted_mass(&metrics);
        }
    }
    Ok(())
}

/// Per-layer means over heads, for the viewer's figures panel and the trace.
/// Restores the cached prefix of `prompt` from `path` or computes and saves it; returns how
/// many prompt tokens the session already holds.
fn use_prefix_cache(gpu: &Gpu, model: &Model, session: &mut Session, prompt: &[u32], path: &Path) -> Result<usize> {
    if path.exists() {
        let cached = session::snapshot_tokens(path)?;
        let n = cached.len();
        if n >= prompt.len() || prompt[..n] != cached[..] {
            let first_diff = cached.iter().zip(prompt).position(|(a, b)| a != b).unwrap_or(n.min(prompt.len()));
            bail!(
                "{}: the cached prefix ({n} tokens) does not begin this prompt ({} tokens; they differ from token {first_diff}); \
                 the prompt must extend the cached one by at least one token - use another file or delete this one",
                path.display(),
                prompt.len()
            );
        }
        session.restore_file(gpu, path).with_context(|| format!("restoring the session cached in {}", path.display()))?;
        return Ok(n);
    }
    if prompt.len() < 2 {
        return Ok(0);
    }
    let n = prompt.len() - 1;
    generate::prefill(model, session, &prompt[..n], &mut Hooks::default())?;
    session.save(gpu, path).with_context(|| format!("saving the prefix cache {}", path.display()))?;
    Ok(n)
}

fn figures(m: &Metrics) -> Vec<LayerFigures> {
    m.omitted_mass
        .iter()
        .map(|s| {
            let n = s.mean.len().max(1) as f32;
            LayerFigures {
                layer: s.layer,
                epsilon: s.mean.iter().map(|h| h.omitted_mass).sum::<f32>() / n,
                error: s.mean.iter().map(|h| h.rel_err).sum::<f32>() / n,
                recall: s.mean.iter().map(|h| h.recall).sum::<f32>() / n,
            }
        })
        .collect()
}

fn print_omitted_mass(m: &Metrics) {
    if m.omitted_mass.is_empty() {
        eprintln!("omitted mass: no sparse rows yet (every query so far fits in index_topk, so attention was exact)");
    }
    for s in &m.omitted_mass {
        eprintln!("layer {} over {} query rows (mean per head: omitted mass / relative error / recall of dense top-k):", s.layer, s.tokens);
        for (h, d) in s.mean.iter().enumerate() {
            let w = &s.worst[h];
            eprintln!(
                "  head {h:>3}: {:.4} / {:.4} / {:.3}   (worst {:.4} / {:.4} / {:.3})",
                d.omitted_mass, d.rel_err, d.recall, w.omitted_mass, w.rel_err, w.recall
            );
        }
    }
}

/// The kernel name of a scoped profiler label ("layer3.mixer.global/topk" -> "topk").
fn op_family(label: &str) -> String {
    label.rsplit('/').next().unwrap_or(label).to_string()
}

fn print_metrics(m: &Metrics) {
    eprintln!(
        "prefill {} tokens in {:.3} s ({:.1} tokens/s); decode {} tokens in {:.3} s ({:.2} tokens/s)",
        m.prompt_tokens, m.prefill_seconds, m.prefill_tokens_per_second, m.generated_tokens, m.decode_seconds, m.decode_tokens_per_second
    );
    if m.prefill_pipeline_seconds + m.decode_pipeline_seconds > 0.0 {
        eprintln!(
            "  of which building GPU pipelines (first use in this process): prefill {:.3} s, decode {:.3} s",
            m.prefill_pipeline_seconds, m.decode_pipeline_seconds
        );
    }
    let peak = m.peak_gpu_bytes.map_or("not reported by this backend".to_string(), k31_engine::plan::human_bytes_u64);
    eprintln!("global cache {} B, KDA state {} B, peak GPU memory {peak}", m.cache_bytes, m.kda_state_bytes);
    for (op, s) in &m.gpu_seconds_by_op {
        eprintln!("  {op:<32} {:>10.3} ms", s * 1e3);
    }
}

fn read_ids(path: &Path) -> Result<Vec<u32>> {
    let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let v: serde_json::Value = serde_json::from_str(&text).with_context(|| format!("{} is not JSON", path.display()))?;
    let arr = v.as_array().with_context(|| format!("{} must hold a flat JSON array of token ids", path.display()))?;
    arr.iter()
        .enumerate()
        .map(|(i, x)| {
            x.as_u64().filter(|&n| n <= u32::MAX as u64).map(|n| n as u32).with_context(|| {
                format!("{}: element {i} ({x}) is not a non-negative integer token id", path.display())
            })
        })
        .collect()
}

pub fn score(args: ScoreArgs, adapter: Option<&str>) -> Result<()> {
    let ids_from_file = match &args.token_ids {
        Some(p) => Some(read_ids(p)?),
        None => None,
    };
    if ids_from_file.is_none() && args.text.is_none() {
        bail!("give --text FILE or --token-ids FILE.json");
    }
    let Loaded { gpu, model, tokenizer } = load(&args.model, adapter, ids_from_file.is_none())?;
    let ids = match (ids_from_file, &args.text) {
        (Some(ids), _) => ids,
        (None, Some(path)) => {
            let text = std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
            tokenizer.context("this model has no tokenizer")?.encode(&text, false)?
        }
        (None, None) => unreachable!("checked above"),
    };
    if ids.is_empty() {
        bail!("nothing to score: the input has no tokens");
    }
    if let Some((i, &bad)) = ids.iter().enumerate().find(|(_, id)| **id as usize >= model.config.vocab_size) {
        bail!("token id {bad} at index {i} is outside the vocabulary of {}", model.config.vocab_size);
    }
    if ids.len() > model.max_context {
        bail!("{} tokens exceed the context of {} (raise --context)", ids.len(), model.max_context);
    }
    let mut session = model.new_session()?;
    let mut profiler = args.model.metrics.then(|| Profiler::new(&gpu, 2048));
    let t0 = std::time::Instant::now();
    // Logits rows go to a raw file chunk by chunk, so a long text never holds [T, vocab] in
    // memory; the safetensors file is then written from that file mapped.
    let part = args.dump_logits.as_ref().map(|p| p.with_extension("logits.part"));
    let mut raw = match &part {
        Some(p) => Some(std::io::BufWriter::new(std::fs::File::create(p).with_context(|| format!("creating {}", p.display()))?)),
        None => None,
    };
    let mut dump = |rows: &[f32]| -> Result<(), ModelError> {
        match raw.as_mut() {
            Some(w) => w.write_all(bytemuck::cast_slice(rows)).map_err(|e| ModelError::Input(format!("writing the logits: {e}"))),
            None => Ok(()),
        }
    };
    let scored = generate::score(&model, &mut session, &ids, &mut Hooks { profiler: profiler.as_mut(), ..Default::default() }, &mut dump);
    let secs = t0.elapsed().as_secs_f64();
    let flushed = raw.take().map_or(Ok(()), |mut w| w.flush());
    let scores = match scored.map_err(anyhow::Error::from).and_then(|s| flushed.map(|_| s).context("writing the logits")) {
        Ok(s) => s,
        Err(e) => {
            if let Some(p) = &part {
                let _ = std::fs::remove_file(p);
            }
            return Err(e);
        }
    };
    if let (Some(path), Some(part)) = (&args.dump_logits, &part) {
        let result = write_logits(path, part, ids.len(), model.config.vocab_size);
        let _ = std::fs::remove_file(part);
        result?;
    }
    if args.json {
        let v = serde_json::json!({"tokens": ids, "logprobs": scores.logprobs, "perplexity": scores.perplexity});
        println!("{}", serde_json::to_string(&v)?);
    } else {
        for (i, lp) in scores.logprobs.iter().enumerate() {
            println!("{:>6} {:>8} {lp:>12.5}", i + 1, ids[i + 1]);
        }
        println!("perplexity {:.4} over {} predicted tokens", scores.perplexity, scores.logprobs.len());
    }
    if let Some(p) = profiler.as_mut() {
        p.collect(&gpu)?;
        eprintln!("scored {} tokens in {secs:.3} s ({:.1} tokens/s)", ids.len(), ids.len() as f64 / secs);
        for t in p.report_by(op_family) {
            eprintln!("  {:<32} {:>10.3} ms", t.label, t.total_ns * 1e-6);
        }
    }
    Ok(())
}

/// The safetensors file `path` with one tensor `logits` [rows, vocab] f32 from the raw rows in
/// `part` (mapped, not read into memory).
fn write_logits(path: &std::path::Path, part: &std::path::Path, rows: usize, vocab: usize) -> Result<()> {
    let file = std::fs::File::open(part).with_context(|| format!("reading back {}", part.display()))?;
    // SAFETY: the part file is ours, written and closed above; nothing changes it while mapped.
    let map = unsafe { memmap2::Mmap::map(&file) }.with_context(|| format!("mapping {}", part.display()))?;
    let view = safetensors::tensor::TensorView::new(safetensors::Dtype::F32, vec![rows, vocab], &map)?;
    safetensors::serialize_to_file([("logits", view)], None, path).with_context(|| format!("writing {}", path.display()))?;
    Ok(())
}
