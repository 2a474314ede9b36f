//! The `k31` command line: argument parsing and printing only; the work is in k31-engine.

use anyhow::{Context, Result};
use clap::{Parser, Subcommand};
use k31_engine::{checkpoint::Checkpoint, config::ModelConfig, gpu, init, plan};
use std::path::{Path, PathBuf};

mod run;

#[derive(Parser)]
#[command(name = "k31", version, about = "Portable inference engine for the Kimi K3.1 hybrid architecture")]
struct Cli {
    /// GPU adapter: an index from `k31 devices` or part of its name (also K31_ADAPTER).
    #[arg(long, global = true)]
    adapter: Option<String>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// List GPU adapters with backend, type, limits and the features k31 uses.
    Devices {
        #[arg(long)]
        json: bool,
    },
    /// Describe a model from its directory or config.json alone: layers, parameters,
    /// bytes, per-sequence state, cache per token and the memory plan.
    Inspect {
        /// Model directory (config.json + safetensors) or a config.json file.
        model: PathBuf,
        /// Context length for the memory plan.
        #[arg(long, default_value_t = 131072)]
        context: usize,
        #[arg(long)]
        json: bool,
    },
    /// Generate text after a prompt, streaming it as it is produced.
    Generate(run::GenerateArgs),
    /// Generate while a window draws, live, which positions each global layer's indexer
    /// selected for every token.
    View(run::ViewArgs),
    /// Per-token log-probabilities and perplexity of a text or a token list.
    Score(run::ScoreArgs),
    /// Write a random checkpoint in the exact K3.1 layout.
    Init {
        /// tiny (tests), small (real per-head widths), k31-slice (real K3.1 widths).
        #[arg(long)]
        preset: String,
        #[arg(long, default_value_t = 0)]
        seed: u64,
        /// Number of layers (every 4th and the last are global).
        #[arg(long)]
        layers: Option<usize>,
        /// Number of routed experts per MoE layer.
        #[arg(long)]
        experts: Option<usize>,
        /// Vocabulary size.
        #[arg(long)]
        vocab: Option<usize>,
        /// Output directory (created; must not already hold a model).
        out_dir: PathBuf,
    },
}

fn main() {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn,wgpu_hal::gles=off")).init();
    let cli = Cli::parse();
    if let Err(e) = run(cli) {
        eprintln!("error: {}", error_chain(&e));
        std::process::exit(1);
    }
}

/// The error and its causes joined by ": ", leaving out a cause whose text the message
/// before it already ends with (error types that print their source, then report it too).
fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.ends_with(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

fn run(cli: Cli) -> Result<()> {
    match cli.command {
        Command::Devices { json } => devices(json, cli.adapter.as_deref()),
        Command::Inspect { model, context, json } => inspect(&model, context, json),
        Command::Generate(args) => run::generate(args, cli.adapter.as_deref()),
        Command::Score(args) => run::score(args, cli.adapter.as_deref()),
        Command::View(args) => run::view(args, cli.adapter.as_deref()),
        Command::Init { preset, seed, layers, experts, vocab, out_dir } => {
            let opt = init::PresetOptions { layers, experts, vocab };
            let config = init::preset_config(&preset, &opt)?;
            let bar = indicatif::ProgressBar::new(0);
            bar.set_style(
                indicatif::ProgressStyle::with_template("{bar:40} {binary_bytes}/{binary_total_bytes} {binary_bytes_per_sec} {eta}")
                    .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
            );
            let written = init::write_checkpoint(&out_dir, &config, seed, |done, total| {
                bar.set_length(total as u64);
                bar.set_position(done as u64);
            })?;
            bar.finish_and_clear();
            println!(
                "wrote {} tensors ({}) to {} in {}",
                written.tensors,
                plan::human_bytes(written.bytes),
                out_dir.display(),
                written.files.join(", ")
            );
            Ok(())
        }
    }
}

fn devices(json: bool, selector: Option<&str>) -> Result<()> {
    let list = gpu::list_adapters();
    if list.is_empty() {
        return Err(gpu::GpuError::NoAdapter.into());
    }
    // Show which one k31 would use (honours --adapter and K31_ADAPTER).
    let chosen = gpu::Gpu::open(selector).map(|g| (g.info.name.clone(), format!("{:?}", g.info.backend))).ok();
    if json {
        let v = serde_json::json!({ "adapters": list, "chosen": chosen.as_ref().map(|c| &c.0) });
        println!("{}", serde_json::to_string_pretty(&v)?);
        return Ok(());
    }
    for a in &list {
        let mark = if chosen.as_ref().is_some_and(|(n, b)| *n == a.name && *b == a.backend) { "*" } else { " " };
        println!("{mark}{} {} [{} {}] driver {} {}", a.index, a.name, a.backend, a.device_type, a.driver, a.driver_info);
        println!(
            "    max binding {}  max buffer {}  workgroup storage {}  invocations {}  subgroup {}..{}",
            plan::human_bytes(a.max_storage_buffer_binding_size as usize),
            plan::human_bytes(a.max_buffer_size as usize),
            plan::human_bytes(a.max_compute_workgroup_storage_size as usize),
            a.max_compute_invocations_per_workgroup,
            a.subgroup_size.0,
            a.subgroup_size.1
        );
        println!("    features {}", if a.features.is_empty() { "(none of those k31 uses)".into() } else { a.features.join(" ") });
    }
    if chosen.is_none() {
        println!("(no adapter could be opened with the current selection)");
    }
    Ok(())
}

fn inspect(model: &Path, context: usize, json: bool) -> Result<()> {
    let has_weights = model.is_dir()
        && (model.join("model.safetensors").exists() || model.join("model.safetensors.index.json").exists());
    let (config, checkpoint) = if has_weights {
        let ck = Checkpoint::open(model)?;
        (ck.config.clone(), Some(ck))
    } else {
        (ModelConfig::from_path(model).with_context(|| format!("inspecting {}", model.display()))?, None)
    };
    let report = plan::report(&config, checkpoint.as_ref(), context);
    if json {
        println!("{}", serde_json::to_string_pretty(&report)?);
    } else {
        print!("{}", report.to_text());
    }
    Ok(())
}
