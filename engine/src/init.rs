//! `k31 init`: random checkpoints in the exact K3.1 layout (config.json + safetensors,
//! MXFP4 experts), deterministic in the seed, written as a stream so that multi-GB
//! presets go at disk speed with one tensor in memory at a time.

use crate::config::{ConfigError, ModelConfig};
use crate::layout::{expected_tensors, DType, Role, TensorSpec};
use rand::{Rng, RngCore, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use std::borrow::Cow;
use std::path::Path;

#[derive(Debug, thiserror::Error)]
pub enum InitError {
    #[error("unknown preset `{0}`; choose tiny, small or k31-slice")]
    UnknownPreset(String),
    #[error("invalid option: {0}")]
    Option(String),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("cannot write {path}: {reason}")]
    Write { path: String, reason: String },
    #[error("{dir} already holds a model (config.json); choose an empty directory")]
    NotEmpty { dir: String },
}

/// Size overrides on top of a preset.
#[derive(Clone, Debug, Default)]
pub struct PresetOptions {
    pub layers: Option<usize>,
    pub experts: Option<usize>,
    pub vocab: Option<usize>,
}

pub const PRESETS: &[&str] = &["tiny", "small", "k31-slice"];

/// The `config.json` of a preset (K3.1 wrapper with `text_config`).
pub fn preset_config(name: &str, opt: &PresetOptions) -> Result<Value, InitError> {
    let mut t = match name {
        "tiny" => json!({
            "vocab_size": 4096, "hidden_size": 256, "num_hidden_layers": 8,
            "max_position_embeddings": 4096, "attn_res_block_size": 3,
            "intermediate_size": 512,
            "num_experts": 16, "num_experts_per_token": 4, "num_shared_experts": 2,
            "moe_intermediate_size": 64, "routed_expert_hidden_size": 128,
            "num_attention_heads": 4, "num_key_value_heads": 4,
            "q_lora_rank": 96, "kv_lora_rank": 64,
            "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32,
            "index_n_heads": 4, "index_head_dim": 32, "index_topk": 64,
            "kda_heads": 2, "kda_head_dim": 128,
        }),
        "small" => json!({
            "vocab_size": 16384, "hidden_size": 1024, "num_hidden_layers": 4,
            "max_position_embeddings": 131072, "attn_res_block_size": 2,
            "intermediate_size": 2048,
            "num_experts": 16, "num_experts_per_token": 4, "num_shared_experts": 2,
            "moe_intermediate_size": 256, "routed_expert_hidden_size": 512,
            "num_attention_heads": 4, "num_key_value_heads": 4,
            "q_lora_rank": 256, "kv_lora_rank": 512,
            "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
            "index_n_heads": 4, "index_head_dim": 128, "index_topk": 256,
            "kda_heads": 4, "kda_head_dim": 128,
        }),
        "k31-slice" => json!({
            "vocab_size": 163840, "hidden_size": 7168, "num_hidden_layers": 4,
            "max_position_embeddings": 1048576, "attn_res_block_size": 12,
            "intermediate_size": 33792,
            "num_experts": 64, "num_experts_per_token": 16, "num_shared_experts": 2,
            "moe_intermediate_size": 3072, "routed_expert_hidden_size": 3584,
            "num_attention_heads": 96, "num_key_value_heads": 96,
            "q_lora_rank": 1536, "kv_lora_rank": 512,
            "qk_nope_head_dim": 128, "qk_rope_head_dim": 64, "v_head_dim": 128,
            "index_n_heads": 32, "index_head_dim": 128, "index_topk": 2048,
            "kda_heads": 96, "kda_head_dim": 128,
        }),
        other => return Err(InitError::UnknownPreset(other.into())),
    };
    let obj = t.as_object_mut().ok_or_else(|| InitError::Option("preset is not an object".into()))?;
    let get = |o: &serde_json::Map<String, Value>, k: &str| o.get(k).and_then(Value::as_u64).unwrap_or(0) as usize;
    if let Some(n) = opt.layers {
        if n == 0 {
            return Err(InitError::Option("--layers must be at least 1".into()));
        }
        obj.insert("num_hidden_layers".into(), json!(n));
    }
    if let Some(e) = opt.experts {
        if e == 0 {
            return Err(InitError::Option("--experts must be at least 1".into()));
        }
        obj.insert("num_experts".into(), json!(e));
        let k = get(obj, "num_experts_per_token").min(e);
        obj.insert("num_experts_per_token".into(), json!(k));
    }
    if let Some(v) = opt.vocab {
        if v < 512 {
            return Err(InitError::Option("--vocab must be at least 512 (256 byte tokens and 256 specials)".into()));
        }
        obj.insert("vocab_size".into(), json!(v));
    }
    // K3's schedule: every 4th layer (1-based) is global, and so is the last one.
    let n = get(obj, "num_hidden_layers");
    let mut full: Vec<usize> = (1..=n).filter(|l| l % 4 == 0).collect();
    if full.last() != Some(&n) {
        full.push(n);
    }
    let kda: Vec<usize> = (1..=n).filter(|l| !full.contains(l)).collect();
    let heads = obj.remove("kda_heads").unwrap_or(json!(2));
    let head_dim = obj.remove("kda_head_dim").unwrap_or(json!(128));
    let vocab = get(obj, "vocab_size");
    let fixed = json!({
        "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear",
        "rms_norm_eps": 1e-5, "tie_word_embeddings": false,
        "hidden_act": "situ", "activation_situ_beta": 4.0, "activation_situ_linear_beta": 25.0,
        "first_k_dense_replace": 1, "moe_layer_freq": 1, "latent_moe_use_norm": true,
        "moe_router_activation_func": "sigmoid", "topk_method": "noaux_tc", "use_grouped_topk": true,
        "num_expert_group": 1, "topk_group": 1, "moe_renormalize": true, "routed_scaling_factor": 1.0,
        "mla_use_nope": true, "mla_use_output_gate": true,
        "index_topk_freq": 1, "index_rope_dim": 0, "index_use_hadamard": false,
        "num_nextn_predict_layers": 0,
        "bos_token_id": vocab - 256, "eos_token_id": vocab - 254, "pad_token_id": vocab - 1,
        "linear_attn_config": {
            "num_heads": heads, "head_dim": head_dim, "short_conv_kernel_size": 4,
            "gate_lower_bound": -5.0, "use_full_rank_gate": true,
            "full_attn_layers": full, "kda_layers": kda,
        },
        "quantization_config": {
            "quant_method": "compressed-tensors", "format": "mxfp4-pack-quantized", "kv_cache_scheme": null,
            "config_groups": {"group_0": {"format": "mxfp4-pack-quantized", "targets": ["Linear"],
                "input_activations": null,
                "weights": {"num_bits": 4, "type": "float", "group_size": 32, "symmetric": true,
                            "strategy": "group", "scale_dtype": "torch.uint8"}}},
            "ignore": ["re:.*self_attn.*", "re:.*shared_experts.*", "re:.*mlp\\.(gate|up|gate_up|down)_proj.*",
                       "re:.*routed_expert_(down|up)_proj.*", "re:.*_res_proj.*", "re:.*lm_head.*"]
        }
    });
    if let Value::Object(f) = fixed {
        obj.extend(f);
    }
    Ok(json!({
        "architectures": ["KimiK31ForConditionalGeneration"],
        "model_type": "kimi_k31",
        "bos_token_id": vocab - 256, "eos_token_id": vocab - 254, "pad_token_id": vocab - 1,
        "tie_word_embeddings": false,
        "k31_preset": name,
        "text_config": t,
    }))
}

/// Stable 64-bit FNV-1a, so a tensor's random stream depends only on (seed, name).
fn fnv1a(seed: u64, s: &str) -> u64 {
    let mut h = 0xcbf29ce484222325u64 ^ seed.wrapping_mul(0x9E3779B97F4A7C15);
    for b in s.bytes() {
        h ^= b as u64;
        h = h.wrapping_mul(0x100000001b3);
    }
    h
}

/// How the values of one tensor are drawn.
#[derive(Clone, Copy, Debug)]
enum Draw {
    /// Uniform with this standard deviation around `mean`.
    Uniform { mean: f32, std: f32 },
    /// log(U(1, 16)) (KDA A_log).
    ALog,
    /// inverse softplus of log-uniform dt in [1e-3, 0.1] (KDA dt_bias).
    DtBias,
    /// Random E2M1 bytes.
    Nibbles,
    /// E8M0 exponents around a base, jittered by -1..=0.
    Scales { base: u8 },
}

/// E2M1 values drawn uniformly over the 16 codes have RMS sqrt(8.5625).
const E2M1_RMS: f32 = 2.926;

fn draw_for(spec: &TensorSpec) -> Draw {
    let shape = spec.shape.canonical();
    let fan_in = shape.last().copied().unwrap_or(1).max(1) as f32;
    match spec.role {
        Role::Embedding => Draw::Uniform { mean: 0.0, std: 1.0 },
        Role::Head | Role::Projection | Role::ResProj | Role::ExpertDense => {
            Draw::Uniform { mean: 0.0, std: fan_in.powf(-0.5) }
        }
        // Norm weights near 1 but not equal, so a kernel that forgets them fails its test.
        Role::Norm => Draw::Uniform { mean: 1.0, std: 0.05 },
        Role::NormBias => Draw::Uniform { mean: 0.0, std: 0.05 },
        Role::Conv => Draw::Uniform { mean: 0.0, std: fan_in.powf(-0.5) },
        Role::ALog => Draw::ALog,
        Role::DtBias => Draw::DtBias,
        Role::RouterBias => Draw::Uniform { mean: 0.0, std: 0.02 },
        Role::ExpertPacked => Draw::Nibbles,
        Role::ExpertScale => {
            // Logical columns = 32 per scale byte; aim for RMS 1/sqrt(fan_in).
            let cols = fan_in * 32.0;
            let target = cols.powf(-0.5) / E2M1_RMS;
            Draw::Scales { base: (127.0 + target.log2().round()).clamp(1.0, 254.0) as u8 }
        }
    }
}

fn fill_f32(draw: Draw, rng: &mut ChaCha8Rng, out: &mut [f32]) {
    match draw {
        Draw::Uniform { mean, std } => {
            let half = std * 3f32.sqrt();
            for v in out {
                *v = mean + half * (2.0 * rng.random::<f32>() - 1.0);
            }
        }
        Draw::ALog => {
            for v in out {
                *v = rng.random_range(1.0f32..16.0).ln();
            }
        }
        Draw::DtBias => {
            for v in out {
                let dt = (rng.random_range(1e-3f32.ln()..0.1f32.ln())).exp();
                *v = dt.exp_m1().ln();
            }
        }
        Draw::Nibbles | Draw::Scales { .. } => unreachable!("byte draws are not float tensors"),
    }
}

/// One tensor generated on demand when the writer asks for its bytes.
struct LazyTensor {
    spec_name: String,
    shape: Vec<usize>,
    dtype: DType,
    draw: Draw,
    seed: u64,
}

/// Elements per independently seeded block, so generation parallelises and stays
/// identical whatever the thread count.
const BLOCK: usize = 1 << 20;

impl LazyTensor {
    fn generate(&self) -> Vec<u8> {
        let numel: usize = self.shape.iter().product();
        let esize = self.dtype.size();
        let mut out = vec![0u8; numel * esize];
        let key = fnv1a(self.seed, &self.spec_name);
        let threads = std::thread::available_parallelism().map_or(1, |n| n.get()).min(numel.div_ceil(BLOCK)).max(1);
        let blocks: Vec<(usize, &mut [u8])> = out.chunks_mut(BLOCK * esize).enumerate().collect();
        let per = blocks.len().div_ceil(threads).max(1);
        let mut groups: Vec<Vec<(usize, &mut [u8])>> = Vec::new();
        let mut it = blocks.into_iter().peekable();
        while it.peek().is_some() {
            groups.push(it.by_ref().take(per).collect());
        }
        std::thread::scope(|s| {
            for g in groups {
                s.spawn(move || {
                    for (bi, bytes) in g {
                        let mut rng = ChaCha8Rng::seed_from_u64(key);
                        rng.set_stream(bi as u64);
                        self.fill_block(&mut rng, bytes);
                    }
                });
            }
        });
        out
    }

    fn fill_block(&self, rng: &mut ChaCha8Rng, bytes: &mut [u8]) {
        match self.draw {
            Draw::Nibbles => rng.fill_bytes(bytes),
            Draw::Scales { base } => {
                for b in bytes {
                    *b = base - (rng.next_u32() & 1) as u8;
                }
            }
            draw => {
                let mut vals = vec![0f32; bytes.len() / self.dtype.size()];
                fill_f32(draw, rng, &mut vals);
                match self.dtype {
                    DType::F32 => bytes.copy_from_slice(bytemuck::cast_slice(&vals)),
                    DType::BF16 => {
                        for (dst, v) in bytes.chunks_exact_mut(2).zip(&vals) {
                            dst.copy_from_slice(&half::bf16::from_f32(*v).to_le_bytes());
                        }
                    }
                    DType::F16 => {
                        for (dst, v) in bytes.chunks_exact_mut(2).zip(&vals) {
                            dst.copy_from_slice(&half::f16::from_f32(*v).to_le_bytes());
                        }
                    }
                    _ => unreachable!("float draws are written as floats"),
                }
            }
        }
    }
}

impl LazyTensor {
    fn st_dtype(&self) -> safetensors::Dtype {
        match self.dtype {
            DType::BF16 => safetensors::Dtype::BF16,
            DType::F16 => safetensors::Dtype::F16,
            DType::F32 => safetensors::Dtype::F32,
            _ => safetensors::Dtype::U8,
        }
    }
}

/// Tensors generated ahead by a producer thread while the writer writes earlier ones.
/// The producer follows the writer's order (dtype, then name); should a writer ask in
/// another order, bytes for other tensors wait in `stash`, and a tensor the producer no
/// longer delivers is generated on the spot: generation is deterministic, so the output
/// never depends on the order.
struct Prefetch {
    rx: std::sync::Mutex<std::sync::mpsc::Receiver<(String, Vec<u8>)>>,
    stash: std::sync::Mutex<std::collections::HashMap<String, Vec<u8>>>,
}

struct PrefetchedTensor<'a> {
    tensor: LazyTensor,
    prefetch: &'a Prefetch,
}

impl PrefetchedTensor<'_> {
    fn take(&self) -> Vec<u8> {
        let name = &self.tensor.spec_name;
        loop {
            if let Some(b) = self.prefetch.stash.lock().unwrap_or_else(|p| p.into_inner()).remove(name) {
                return b;
            }
            let next = self.prefetch.rx.lock().unwrap_or_else(|p| p.into_inner()).recv();
            match next {
                Ok((n, b)) if n == *name => return b,
                Ok((n, b)) => {
                    self.prefetch.stash.lock().unwrap_or_else(|p| p.into_inner()).insert(n, b);
                }
                Err(_) => return self.tensor.generate(),
            }
        }
    }
}

impl safetensors::View for PrefetchedTensor<'_> {
    fn dtype(&self) -> safetensors::Dtype {
        self.tensor.st_dtype()
    }
    fn shape(&self) -> &[usize] {
        &self.tensor.shape
    }
    fn data(&self) -> Cow<'_, [u8]> {
        Cow::Owned(self.take())
    }
    fn data_len(&self) -> usize {
        self.tensor.shape.iter().product::<usize>() * self.tensor.dtype.size()
    }
}

/// Shards stay under this size (the size HF checkpoints use).
pub const SHARD_BYTES: usize = 4 << 30;

/// Summary of a written checkpoint.
#[derive(Clone, Debug)]
pub struct Written {
    pub files: Vec<String>,
    pub bytes: usize,
    pub tensors: usize,
}

/// Writes `config` and random weights for it into `dir`. `progress(done, total)` is
/// called after every shard.
pub fn write_checkpoint(
    dir: &Path,
    config: &Value,
    seed: u64,
    mut progress: impl FnMut(usize, usize),
) -> Result<Written, InitError> {
    let cfg = ModelConfig::from_json(config)?;
    let wr = |p: &Path, e: &dyn std::fmt::Display| InitError::Write { path: p.display().to_string(), reason: e.to_string() };
    if dir.join("config.json").exists() {
        return Err(InitError::NotEmpty { dir: dir.display().to_string() });
    }
    std::fs::create_dir_all(dir).map_err(|e| wr(dir, &e))?;
    let specs = expected_tensors(&cfg);
    let total: usize = specs.iter().map(TensorSpec::canonical_bytes).sum();
    // Group tensors into shards in layout order.
    let mut shards: Vec<Vec<&TensorSpec>> = vec![Vec::new()];
    let mut size = 0;
    for s in &specs {
        let b = s.canonical_bytes();
        if size > 0 && size + b > SHARD_BYTES {
            shards.push(Vec::new());
            size = 0;
        }
        size += b;
        if let Some(last) = shards.last_mut() {
            last.push(s);
        }
    }
    let n = shards.len();
    let name_of = |i: usize| {
        if n == 1 { "model.safetensors".to_string() } else { format!("model-{:05}-of-{n:05}.safetensors", i + 1) }
    };
    let mut weight_map = serde_json::Map::new();
    let mut done = 0;
    let mut files = Vec::new();
    for (i, shard) in shards.iter().enumerate() {
        let file = name_of(i);
        let lazy = |s: &TensorSpec| LazyTensor {
            spec_name: s.name.clone(),
            shape: s.shape.canonical(),
            dtype: s.canonical,
            draw: draw_for(s),
            seed,
        };
        // The order safetensors writes in: larger dtype first, then by name.
        let mut order: Vec<&TensorSpec> = shard.clone();
        order.sort_by(|a, b| lazy(b).st_dtype().cmp(&lazy(a).st_dtype()).then(a.name.cmp(&b.name)));
        let (tx, rx) = std::sync::mpsc::sync_channel::<(String, Vec<u8>)>(2);
        let prefetch = Prefetch { rx: std::sync::Mutex::new(rx), stash: Default::default() };
        let path = dir.join(&file);
        let result = std::thread::scope(|scope| {
            let producer_specs: Vec<LazyTensor> = order.iter().map(|s| lazy(s)).collect();
            scope.spawn(move || {
                for t in producer_specs {
                    if tx.send((t.spec_name.clone(), t.generate())).is_err() {
                        break;
                    }
                }
            });
            let tensors: Vec<(String, PrefetchedTensor)> = shard
                .iter()
                .map(|s| {
                    let name = format!("language_model.{}", s.name);
                    weight_map.insert(name.clone(), json!(file));
                    (name, PrefetchedTensor { tensor: lazy(s), prefetch: &prefetch })
                })
                .collect();
            let meta = std::collections::HashMap::from([("format".to_string(), "pt".to_string())]);
            let r = safetensors::serialize_to_file(tensors, Some(meta), &path);
            // Unblock the producer if the writer stopped early.
            drop(prefetch.rx.lock().map(|rx| while rx.try_recv().is_ok() {}));
            r
        });
        drop(prefetch);
        result.map_err(|e| wr(&path, &e))?;
        done += shard.iter().map(|s| s.canonical_bytes()).sum::<usize>();
        progress(done, total);
        files.push(file);
    }
    if n > 1 {
        let index = json!({"metadata": {"total_size": total}, "weight_map": weight_map});
        let path = dir.join("model.safetensors.index.json");
        let text = serde_json::to_string_pretty(&index).map_err(|e| wr(&path, &e))?;
        std::fs::write(&path, text).map_err(|e| wr(&path, &e))?;
    }
    write_tokenizer(dir, cfg.vocab_size)?;
    // The config goes last: a directory with config.json is a complete model.
    let path = dir.join("config.json");
    let text = serde_json::to_string_pretty(config).map_err(|e| wr(&path, &e))?;
    std::fs::write(&path, text + "\n").map_err(|e| wr(&path, &e))?;
    Ok(Written { files, bytes: total, tensors: specs.len() })
}

/// Named specials at their offset from the first special id (Kimi's layout).
const SPECIALS: &[(usize, &str)] = &[
    (0, "[BOS]"),
    (1, "[EOS]"),
    (2, "<|im_end|>"),
    (3, "<|im_user|>"),
    (4, "<|im_assistant|>"),
    (9, "[EOT]"),
    (10, "<|im_system|>"),
    (17, "<|im_middle|>"),
    (254, "[UNK]"),
    (255, "[PAD]"),
];

/// A byte-level tokenizer for a random model, in Kimi's formats: `tiktoken.model` (base64
/// bytes and rank per line: all 256 bytes, then two-byte pieces of printable ASCII, most
/// common letters first) and `tokenizer_config.json` naming the specials at the vocabulary end.
pub fn write_tokenizer(dir: &Path, vocab: usize) -> Result<(), InitError> {
    use base64::Engine as _;
    let wr = |p: &Path, e: &dyn std::fmt::Display| InitError::Write { path: p.display().to_string(), reason: e.to_string() };
    let ranks = vocab.saturating_sub(256);
    let order = " etaoinsrhldcumfpgwybvkxjqzETAOINSRHLDCUMFPGWYBVKXJQZ0123456789.,'\"-!?:;()";
    let mut chars: Vec<u8> = order.bytes().collect();
    chars.extend((0x20u8..0x7f).filter(|c| !order.as_bytes().contains(c)));
    let mut pieces: Vec<Vec<u8>> = (0..=255u8).map(|b| vec![b]).collect();
    let mut pairs: Vec<(usize, u8, u8)> = Vec::new();
    for (i, &a) in chars.iter().enumerate() {
        for (j, &b) in chars.iter().enumerate() {
            pairs.push((i + j, a, b));
        }
    }
    pairs.sort();
    pieces.extend(pairs.into_iter().map(|(_, a, b)| vec![a, b]));
    pieces.truncate(ranks);
    let mut text = String::new();
    for (rank, p) in pieces.iter().enumerate() {
        text.push_str(&base64::engine::general_purpose::STANDARD.encode(p));
        text.push(' ');
        text.push_str(&rank.to_string());
        text.push('\n');
    }
    let path = dir.join("tiktoken.model");
    std::fs::write(&path, text).map_err(|e| wr(&path, &e))?;
    let mut added = serde_json::Map::new();
    for &(off, name) in SPECIALS {
        added.insert((ranks + off).to_string(), json!({"content": name, "special": true}));
    }
    let cfg = json!({
        "tokenizer_class": "TikTokenTokenizer",
        "bos_token": "[BOS]", "eos_token": "<|im_end|>", "pad_token": "[PAD]", "unk_token": "[UNK]",
        "added_tokens_decoder": added,
    });
    let path = dir.join("tokenizer_config.json");
    let text = serde_json::to_string_pretty(&cfg).map_err(|e| wr(&path, &e))?;
    std::fs::write(&path, text).map_err(|e| wr(&path, &e))
}
