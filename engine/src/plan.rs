//! What `k31 inspect` reports: the layer schedule, parameter counts, bytes by dtype,
//! per-sequence state and per-token cache, and the memory plan for a context length.

use crate::checkpoint::Checkpoint;
use crate::config::{Ffn, Mixer, ModelConfig};
use crate::layout::{activation_name, expected_tensors, param_counts, DType, ParamCounts};
use std::collections::BTreeMap;
use std::fmt::Write as _;

/// Prompt tokens processed per prefill chunk (bounds activation memory).
pub const PREFILL_CHUNK: usize = 512;

#[derive(Clone, Debug, serde::Serialize)]
pub struct MemoryPlan {
    pub context: usize,
    pub weights_bytes: usize,
    pub kda_state_bytes: usize,
    pub global_cache_bytes: usize,
    /// Estimated transient buffers of one prefill chunk.
    pub workspace_bytes: usize,
    pub total_bytes: usize,
}

#[derive(Clone, Debug, serde::Serialize)]
pub struct Report {
    pub architecture: String,
    pub layers: usize,
    pub kda_layers: usize,
    pub global_layers: usize,
    /// 1-based, as config.json lists them.
    pub global_layer_indices: Vec<usize>,
    pub dense_ffn_layers: Vec<usize>,
    pub sparse_attention: Option<usize>,
    pub hidden_size: usize,
    pub vocab_size: usize,
    pub activation: String,
    pub attn_res_block_size: Option<usize>,
    pub params: ParamCounts,
    pub tensors: usize,
    /// From the files when weights were given, else the canonical dtypes.
    pub bytes_by_dtype: BTreeMap<String, usize>,
    pub weights_from_files: bool,
    pub kda_recurrent_state_bytes: usize,
    pub kda_conv_state_bytes: usize,
    pub global_cache_bytes_per_token: usize,
    pub plan: MemoryPlan,
    pub config: ModelConfig,
}

pub fn report(cfg: &ModelConfig, checkpoint: Option<&Checkpoint>, context: usize) -> Report {
    let specs = expected_tensors(cfg);
    let params = param_counts(cfg, &specs);
    let bytes_by_dtype: BTreeMap<DType, usize> = match checkpoint {
        Some(ck) => ck.bytes_by_dtype(),
        None => {
            let mut m = BTreeMap::new();
            for s in &specs {
                *m.entry(s.canonical).or_insert(0) += s.canonical_bytes();
            }
            m
        }
    };
    let weights_bytes = bytes_by_dtype.values().sum();
    let kda = cfg.kda_state_bytes();
    let per_token = cfg.global_cache_bytes_per_token();
    let workspace = workspace_bytes(cfg);
    let plan = MemoryPlan {
        context,
        weights_bytes,
        kda_state_bytes: kda.recurrent + kda.conv,
        global_cache_bytes: per_token * context,
        workspace_bytes: workspace,
        total_bytes: weights_bytes + kda.recurrent + kda.conv + per_token * context + workspace,
    };
    let one_based = |f: &dyn Fn(usize) -> bool| (0..cfg.num_layers()).filter(|&l| f(l)).map(|l| l + 1).collect();
    Report {
        architecture: cfg.architecture.name().into(),
        layers: cfg.num_layers(),
        kda_layers: cfg.count_mixer(Mixer::Kda),
        global_layers: cfg.count_mixer(Mixer::Global),
        global_layer_indices: one_based(&|l| cfg.layers[l].mixer == Mixer::Global),
        dense_ffn_layers: one_based(&|l| cfg.layers[l].ffn == Ffn::Dense),
        sparse_attention: cfg.indexer.as_ref().map(|i| i.topk),
        hidden_size: cfg.hidden_size,
        vocab_size: cfg.vocab_size,
        activation: activation_name(&cfg.activation),
        attn_res_block_size: cfg.attn_res_block_size,
        params,
        tensors: specs.len(),
        bytes_by_dtype: bytes_by_dtype.into_iter().map(|(d, b)| (d.name().to_string(), b)).collect(),
        weights_from_files: checkpoint.is_some(),
        kda_recurrent_state_bytes: kda.recurrent,
        kda_conv_state_bytes: kda.conv,
        global_cache_bytes_per_token: per_token,
        plan,
        config: cfg.clone(),
    }
}

/// Transient f32 buffers of one prefill chunk: the AttnRes working set (bank entries,
/// carry, partial block), the widest mixer and FFN intermediates, and one row of logits
/// per token of the chunk's last position only.
fn workspace_bytes(cfg: &ModelConfig) -> usize {
    let d = cfg.hidden_size;
    let bank = cfg.attn_res_block_size.map_or(1, |s| cfg.num_layers().div_ceil(s) + 1);
    let kda = cfg.kda.as_ref().map_or(0, |k| k.proj_dim() * 8);
    let mla = cfg.mla.as_ref().map_or(0, |m| m.num_heads * (m.qk_head_dim() + 2 * m.v_head_dim) + m.cache_row());
    let moe = cfg.moe.as_ref().map_or(0, |m| {
        m.experts_per_token * (m.moe_intermediate_size * 2 + m.expert_io(d))
            + m.num_shared_experts * m.moe_intermediate_size * 2
    });
    let ffn = moe.max(cfg.intermediate_size * 2);
    PREFILL_CHUNK * 4 * (d * (bank + 4) + kda.max(mla).max(ffn)) + cfg.vocab_size * 4
}

/// 1234567 -> "1,234,567".
pub fn thousands(n: usize) -> String {
    let s = n.to_string();
    let mut out = String::new();
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// Bytes with a binary unit.
pub fn human_bytes(b: usize) -> String {
    let units = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = b as f64;
    let mut u = 0;
    while v >= 1024.0 && u + 1 < units.len() {
        v /= 1024.0;
        u += 1;
    }
    if u == 0 { format!("{b} B") } else { format!("{v:.1} {}", units[u]) }
}

pub fn human_bytes_u64(b: u64) -> String {
    human_bytes(b as usize)
}

fn human_count(n: usize) -> String {
    if n >= 1_000_000_000 {
        format!("{:.2}B", n as f64 / 1e9)
    } else if n >= 1_000_000 {
        format!("{:.2}M", n as f64 / 1e6)
    } else {
        thousands(n)
    }
}

impl Report {
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        let c = &self.config;
        let _ = writeln!(s, "architecture   {}", self.architecture);
        let attn = match self.sparse_attention {
            Some(k) => format!("sparse DSA, top-{k}"),
            None => "dense".into(),
        };
        let _ = writeln!(
            s,
            "layers         {} ({} KDA, {} global: gated MLA, {attn})",
            self.layers, self.kda_layers, self.global_layers
        );
        let list = |v: &[usize]| v.iter().map(|x| x.to_string()).collect::<Vec<_>>().join(" ");
        let _ = writeln!(s, "  global       {} (1-based)", list(&self.global_layer_indices));
        let _ = writeln!(s, "  dense FFN    {} (1-based; the others are MoE)", list(&self.dense_ffn_layers));
        let _ = writeln!(s, "hidden         {}   vocab {}   {}", self.hidden_size, thousands(self.vocab_size), self.activation);
        if let Some(k) = &c.kda {
            let gate = match k.gate {
                crate::config::KdaGate::Bounded { lower_bound } => format!("bounded gate (lower bound {lower_bound})"),
                crate::config::KdaGate::Softplus => "softplus gate".into(),
            };
            let _ = writeln!(
                s,
                "KDA            {} heads x {}, conv {}, {gate}, {:?} output gate",
                k.num_heads, k.head_dim, k.conv_kernel, k.output_gate
            );
        }
        if let Some(m) = &c.mla {
            let q = m.q_lora_rank.map_or("q_proj".to_string(), |r| format!("q_lora {r}"));
            let _ = writeln!(
                s,
                "MLA            {} heads, nope {} + rope {} (not rotated), v {}, kv_lora {}, {q}, output gate {}",
                m.num_heads, m.qk_nope_head_dim, m.qk_rope_head_dim, m.v_head_dim, m.kv_lora_rank, m.output_gate
            );
        }
        if let Some(i) = &c.indexer {
            let _ = writeln!(s, "indexer        {} heads x {}, top-{}", i.n_heads, i.head_dim, i.topk);
        }
        if let Some(m) = &c.moe {
            let latent = m.latent_size.map_or("no latent projection".to_string(), |l| format!("latent {l}"));
            let _ = writeln!(
                s,
                "MoE            {} experts, top-{}, {} shared, intermediate {}, {latent}, experts {:?}",
                m.num_experts, m.experts_per_token, m.num_shared_experts, m.moe_intermediate_size, m.expert_format
            );
        }
        if let Some(b) = self.attn_res_block_size {
            let _ = writeln!(s, "AttnRes        block size {b}");
        }
        let p = &self.params;
        let _ = writeln!(
            s,
            "parameters     {} total ({}), {} active per token ({}), embedding {}, routed experts {}",
            thousands(p.total),
            human_count(p.total),
            thousands(p.active_per_token),
            human_count(p.active_per_token),
            human_count(p.embedding),
            human_count(p.routed_experts)
        );
        let src = if self.weights_from_files { "in the files" } else { "canonical dtypes" };
        let by: Vec<String> = self.bytes_by_dtype.iter().map(|(d, b)| format!("{d} {}", human_bytes(*b))).collect();
        let _ = writeln!(s, "weights        {} ({src}: {}), {} tensors", human_bytes(self.plan.weights_bytes), by.join(", "), thousands(self.tensors));
        let _ = writeln!(
            s,
            "KDA state      {} per sequence ({} recurrent f32 + {} conv window f32)",
            human_bytes(self.kda_recurrent_state_bytes + self.kda_conv_state_bytes),
            human_bytes(self.kda_recurrent_state_bytes),
            human_bytes(self.kda_conv_state_bytes)
        );
        let row = c.mla.as_ref().map_or(0, |m| m.cache_row()) + c.indexer.as_ref().map_or(0, |i| i.head_dim);
        let _ = writeln!(
            s,
            "global cache   {} B per token ({} layers x ({row} values) x bf16)",
            thousands(self.global_cache_bytes_per_token),
            self.global_layers
        );
        let m = &self.plan;
        let _ = writeln!(
            s,
            "memory plan    context {}: weights {} + KDA state {} + global cache {} + workspace {} = {}",
            thousands(m.context),
            human_bytes(m.weights_bytes),
            human_bytes(m.kda_state_bytes),
            human_bytes(m.global_cache_bytes),
            human_bytes(m.workspace_bytes),
            human_bytes(m.total_bytes)
        );
        for n in &c.notes {
            let _ = writeln!(s, "note           {n}");
        }
        s
    }
}
