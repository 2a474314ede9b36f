//! One normalised description of a K3.1-family model, parsed from `config.json`.
//!
//! Three spellings arrive here: the K3.1 / K3 wrapper (`text_config` nested under a VLM
//! config, Moonshot key names, `linear_attn_config`), Moonshot's original Kimi Linear file
//! (flat, `linear_attn_config`, `first_k_dense_replace`) and transformers' Kimi Linear file
//! (`layer_types`, `mlp_layer_types`, attribute-mapped names). Everything downstream reads
//! only [`ModelConfig`]; no other module looks at JSON keys.

use serde_json::{Map, Value};
use std::path::Path;

/// The model family a config describes; decides defaults that the file does not spell out.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Architecture {
    /// Kimi K3.1: K3 plus DeepSeek sparse attention (indexer + top-k) on the global layers.
    KimiK31,
    /// Kimi K3: dense gated MLA on the global layers.
    KimiK3,
    /// Kimi Linear (48B-A3B family): softplus KDA gate, low-rank output gate, plain MoE.
    KimiLinear,
}

impl Architecture {
    pub fn name(self) -> &'static str {
        match self {
            Architecture::KimiK31 => "Kimi K3.1 (KDA + gated MLA with DSA, LatentMoE, Block AttnRes)",
            Architecture::KimiK3 => "Kimi K3 (KDA + dense gated MLA, LatentMoE, Block AttnRes)",
            Architecture::KimiLinear => "Kimi Linear (KDA + MLA, MoE)",
        }
    }
}

/// Token mixer of one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Mixer {
    /// Kimi Delta Attention (recurrent, constant state).
    Kda,
    /// Global MLA layer; sparse (DSA) when the config has an indexer.
    Global,
}

/// Feed-forward block of one layer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum Ffn {
    Dense,
    Moe,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub struct LayerSpec {
    pub mixer: Mixer,
    pub ffn: Ffn,
}

/// KDA forget-gate form (spec 4.2).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub enum KdaGate {
    /// K3: `g = lower_bound * sigmoid(exp(A_log) * (f + dt_bias))`.
    Bounded { lower_bound: f32 },
    /// Kimi Linear: `g = -exp(A_log) * softplus(f + dt_bias)`.
    Softplus,
}

/// KDA output gate projection.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum KdaOutputGate {
    /// `g_proj` [P, d].
    FullRank,
    /// `g_a_proj` [head_dim, d] then `g_b_proj` [P, head_dim].
    LowRank,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct KdaConfig {
    pub num_heads: usize,
    pub head_dim: usize,
    pub conv_kernel: usize,
    pub gate: KdaGate,
    pub output_gate: KdaOutputGate,
}

impl KdaConfig {
    /// Projection width P = heads x head_dim.
    pub fn proj_dim(&self) -> usize {
        self.num_heads * self.head_dim
    }
}

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct MlaConfig {
    pub num_heads: usize,
    /// `None`: a single `q_proj` instead of `q_a_proj` -> norm -> `q_b_proj`.
    pub q_lora_rank: Option<usize>,
    pub kv_lora_rank: usize,
    pub qk_nope_head_dim: usize,
    pub qk_rope_head_dim: usize,
    pub v_head_dim: usize,
    /// Sigmoid gate on the attention output before `o_proj` (`mla_use_output_gate`).
    pub output_gate: bool,
    /// epsilon of `q_a_layernorm` / `kv_a_layernorm` (spec Q6: 1e-6 by default).
    pub latent_norm_eps: f32,
}

impl MlaConfig {
    pub fn qk_head_dim(&self) -> usize {
        self.qk_nope_head_dim + self.qk_rope_head_dim
    }
    /// Softmax scale (nope + rope)^-1/2; no mscale (the model has no rope scaling).
    pub fn softmax_scale(&self) -> f32 {
        (self.qk_head_dim() as f32).powf(-0.5)
    }
    /// Width of one latent cache row: normalised latent then raw k_pe.
    pub fn cache_row(&self) -> usize {
        self.kv_lora_rank + self.qk_rope_head_dim
    }
}

/// DeepSeek sparse attention indexer (K3.1 only; spec 5.3).
#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct IndexerConfig {
    pub n_heads: usize,
    pub head_dim: usize,
    pub topk: usize,
    /// LayerNorm epsilon of the index key (spec 2.2).
    pub key_norm_eps: f32,
}

#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub enum Activation {
    /// SiTU-GLU (spec 2.4); `linear_beta` None skips the bounded `up`.
    Situ { beta: f32, linear_beta: Option<f32> },
    /// SiLU-GLU (Kimi Linear).
    Silu,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct RouterConfig {
    pub num_expert_group: usize,
    pub topk_group: usize,
    pub renormalize: bool,
    pub routed_scaling_factor: f32,
}

/// How routed expert weights are stored.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
pub enum ExpertFormat {
    /// compressed-tensors `mxfp4-pack-quantized`, group 32 (spec 7).
    Mxfp4,
    /// Plain bf16 `weight` tensors.
    Bf16,
}

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct MoeConfig {
    pub num_experts: usize,
    pub experts_per_token: usize,
    pub num_shared_experts: usize,
    pub moe_intermediate_size: usize,
    /// LatentMoE width (`routed_expert_hidden_size`); `None` = experts read the full width.
    pub latent_size: Option<usize>,
    pub latent_norm: bool,
    pub router: RouterConfig,
    pub expert_format: ExpertFormat,
}

impl MoeConfig {
    /// Width the routed experts read and write.
    pub fn expert_io(&self, hidden: usize) -> usize {
        self.latent_size.unwrap_or(hidden)
    }
}

#[derive(Clone, Debug, PartialEq, serde::Serialize)]
pub struct ModelConfig {
    pub architecture: Architecture,
    pub vocab_size: usize,
    pub hidden_size: usize,
    pub rms_norm_eps: f32,
    pub max_position_embeddings: usize,
    pub tie_word_embeddings: bool,
    pub activation: Activation,
    /// Dense MLP width (the first `first_k_dense_replace` layers).
    pub intermediate_size: usize,
    pub layers: Vec<LayerSpec>,
    pub kda: Option<KdaConfig>,
    pub mla: Option<MlaConfig>,
    pub indexer: Option<IndexerConfig>,
    pub moe: Option<MoeConfig>,
    /// Block Attention Residuals block size in layers; `None` = plain additive residuals.
    pub attn_res_block_size: Option<usize>,
    pub bos_token_id: Option<u32>,
    pub eos_token_id: Option<u32>,
    pub pad_token_id: Option<u32>,
    /// Harmless oddities found while parsing, shown by `k31 inspect`.
    pub notes: Vec<String>,
}

/// What is wrong with a config, always naming the key.
#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("cannot read {path}: {source}")]
    Io { path: String, source: std::io::Error },
    #[error("{path} is not valid JSON: {source}")]
    Json { path: String, source: serde_json::Error },
    #[error("config key `{key}` is missing")]
    Missing { key: String },
    #[error("config key `{key}` is invalid: {reason}")]
    Invalid { key: String, reason: String },
    #[error(
        "unsupported architecture `{name}` (key `{key}`); k31 runs KimiK31ForConditionalGeneration, \
         KimiK3ForConditionalGeneration and KimiLinearForCausalLM"
    )]
    UnknownArchitecture { key: String, name: String },
}

type Result<T> = std::result::Result<T, ConfigError>;

/// A JSON object with the dotted path it came from, so every error names the full key.
struct Keys<'a> {
    obj: &'a Map<String, Value>,
    prefix: String,
}

impl<'a> Keys<'a> {
    fn new(obj: &'a Map<String, Value>, prefix: &str) -> Self {
        Keys { obj, prefix: prefix.to_string() }
    }
    fn path(&self, key: &str) -> String {
        if self.prefix.is_empty() { key.to_string() } else { format!("{}.{key}", self.prefix) }
    }
    fn invalid(&self, key: &str, reason: impl Into<String>) -> ConfigError {
        ConfigError::Invalid { key: self.path(key), reason: reason.into() }
    }
    /// The value under the first of `names` that is present and not null; two present
    /// aliases must agree.
    fn get_any<'n>(&self, names: &[&'n str]) -> Result<Option<(&'a Value, &'n str)>> {
        let mut found: Option<(&'a Value, &'n str)> = None;
        for &n in names {
            if let Some(v) = self.obj.get(n).filter(|v| !v.is_null()) {
                if let Some((prev, pn)) = found {
                    if prev != v {
                        return Err(self.invalid(
                            n,
                            format!("disagrees with its alias `{}` ({v} vs {prev})", self.path(pn)),
                        ));
                    }
                } else {
                    found = Some((v, n));
                }
            }
        }
        Ok(found)
    }
    fn usize_opt(&self, names: &[&str]) -> Result<Option<usize>> {
        match self.get_any(names)? {
            None => Ok(None),
            Some((v, n)) => v
                .as_u64()
                .map(|x| Some(x as usize))
                .ok_or_else(|| self.invalid(n, format!("expected a non-negative integer, found {v}"))),
        }
    }
    fn usize(&self, names: &[&str]) -> Result<usize> {
        self.usize_opt(names)?.ok_or_else(|| ConfigError::Missing { key: self.path(names[0]) })
    }
    /// A positive integer (sizes and counts that cannot be zero).
    fn positive(&self, names: &[&str]) -> Result<usize> {
        let v = self.usize(names)?;
        if v == 0 {
            return Err(self.invalid(names[0], "must be at least 1"));
        }
        Ok(v)
    }
    fn f32_opt(&self, names: &[&str]) -> Result<Option<f32>> {
        match self.get_any(names)? {
            None => Ok(None),
            Some((v, n)) => v
                .as_f64()
                .filter(|x| x.is_finite())
                .map(|x| Some(x as f32))
                .ok_or_else(|| self.invalid(n, format!("expected a finite number, found {v}"))),
        }
    }
    fn bool_opt(&self, names: &[&str]) -> Result<Option<bool>> {
        match self.get_any(names)? {
            None => Ok(None),
            Some((v, n)) => {
                v.as_bool().map(Some).ok_or_else(|| self.invalid(n, format!("expected true or false, found {v}")))
            }
        }
    }
    fn str_opt(&self, names: &[&str]) -> Result<Option<&'a str>> {
        match self.get_any(names)? {
            None => Ok(None),
            Some((v, n)) => v.as_str().map(Some).ok_or_else(|| self.invalid(n, format!("expected a string, found {v}"))),
        }
    }
    fn object(&self, key: &str) -> Result<Option<Keys<'a>>> {
        match self.obj.get(key).filter(|v| !v.is_null()) {
            None => Ok(None),
            Some(Value::Object(o)) => Ok(Some(Keys::new(o, &self.path(key)))),
            Some(v) => Err(self.invalid(key, format!("expected an object, found {v}"))),
        }
    }
    fn array(&self, key: &str) -> Result<Option<&'a Vec<Value>>> {
        match self.obj.get(key).filter(|v| !v.is_null()) {
            None => Ok(None),
            Some(Value::Array(a)) => Ok(Some(a)),
            Some(v) => Err(self.invalid(key, format!("expected a list, found {v}"))),
        }
    }
    fn token_id(&self, key: &str) -> Result<Option<u32>> {
        match self.obj.get(key).filter(|v| !v.is_null()) {
            None => Ok(None),
            // Some configs list several EOS ids; the first is the primary one.
            Some(Value::Array(a)) => match a.first() {
                None => Ok(None),
                Some(v) => v.as_u64().map(|x| Some(x as u32)).ok_or_else(|| self.invalid(key, "expected integer ids")),
            },
            Some(v) => v.as_u64().map(|x| Some(x as u32)).ok_or_else(|| self.invalid(key, "expected an integer id")),
        }
    }
}

impl ModelConfig {
    /// Reads `config.json` from a file, or from a directory that holds one.
    pub fn from_path(path: &Path) -> Result<ModelConfig> {
        let file = if path.is_dir() { path.join("config.json") } else { path.to_path_buf() };
        let text = std::fs::read_to_string(&file)
            .map_err(|source| ConfigError::Io { path: file.display().to_string(), source })?;
        let value: Value = serde_json::from_str(&text)
            .map_err(|source| ConfigError::Json { path: file.display().to_string(), source })?;
        Self::from_json(&value)
    }

    pub fn from_json(root: &Value) -> Result<ModelConfig> {
        let Value::Object(root_obj) = root else {
            return Err(ConfigError::Invalid { key: "<root>".into(), reason: "expected a JSON object".into() });
        };
        let top = Keys::new(root_obj, "");
        let arch_name = first_architecture(&top)?;
        match arch_name.as_deref() {
            Some("KimiK31ForConditionalGeneration") | Some("KimiK3ForConditionalGeneration") => {
                let text = top.object("text_config")?.ok_or(ConfigError::Missing { key: "text_config".into() })?;
                let has_index = text.obj.contains_key("index_topk");
                let arch = match (arch_name.as_deref(), has_index) {
                    (Some("KimiK31ForConditionalGeneration"), true) => Architecture::KimiK31,
                    (Some("KimiK31ForConditionalGeneration"), false) => {
                        return Err(ConfigError::Missing { key: "text_config.index_topk".into() });
                    }
                    // A K3 wrapper that carries index keys is a K3.1 model under another name.
                    (_, true) => Architecture::KimiK31,
                    (_, false) => Architecture::KimiK3,
                };
                parse_text(&text, arch, &top)
            }
            Some("KimiLinearForCausalLM") => {
                // A text_config of our own family may sit under an unnamed wrapper too.
                if let Some(text) = top.object("text_config")? {
                    return parse_text(&text, Architecture::KimiLinear, &top);
                }
                let arch =
                    if top.obj.contains_key("index_topk") { Architecture::KimiK31 } else { Architecture::KimiLinear };
                // Moonshot's K3 text config also calls itself KimiLinearForCausalLM; its
                // AttnRes / LatentMoE keys tell it apart from the 48B Kimi Linear.
                let arch = if arch == Architecture::KimiLinear && top.obj.contains_key("attn_res_block_size") {
                    Architecture::KimiK3
                } else {
                    arch
                };
                parse_text(&top, arch, &top)
            }
            Some(other) => Err(ConfigError::UnknownArchitecture { key: "architectures".into(), name: other.into() }),
            None => Err(ConfigError::Missing { key: "architectures".into() }),
        }
    }

    pub fn num_layers(&self) -> usize {
        self.layers.len()
    }
    pub fn count_mixer(&self, m: Mixer) -> usize {
        self.layers.iter().filter(|l| l.mixer == m).count()
    }
    pub fn is_sparse(&self) -> bool {
        self.indexer.is_some()
    }

    /// Bytes of global-layer cache per token: latent row + index key per global layer,
    /// in bf16 (spec 5.5: 33,792 B for K3.1).
    pub fn global_cache_bytes_per_token(&self) -> usize {
        let Some(mla) = &self.mla else { return 0 };
        let index = self.indexer.as_ref().map_or(0, |i| i.head_dim);
        self.count_mixer(Mixer::Global) * (mla.cache_row() + index) * 2
    }

    /// Bytes of KDA state per sequence: the f32 recurrent state and the conv window (the
    /// engine keeps a ring of `kernel` pre-conv inputs of q, k and v per channel, in f32).
    pub fn kda_state_bytes(&self) -> KdaStateBytes {
        let Some(kda) = &self.kda else { return KdaStateBytes::default() };
        let n = self.count_mixer(Mixer::Kda);
        KdaStateBytes {
            recurrent: n * kda.num_heads * kda.head_dim * kda.head_dim * 4,
            conv: n * kda.conv_kernel * 3 * kda.proj_dim() * 4,
        }
    }
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct KdaStateBytes {
    pub recurrent: usize,
    pub conv: usize,
}

fn first_architecture(k: &Keys) -> Result<Option<String>> {
    match k.array("architectures")? {
        None => Ok(None),
        Some(a) => match a.first() {
            None => Err(k.invalid("architectures", "the list is empty")),
            Some(Value::String(s)) => Ok(Some(s.clone())),
            Some(v) => Err(k.invalid("architectures", format!("expected names, found {v}"))),
        },
    }
}

/// Parses the text model's keys; `outer` supplies token ids when the text config lacks them.
fn parse_text(k: &Keys, architecture: Architecture, outer: &Keys) -> Result<ModelConfig> {
    let hidden_size = k.positive(&["hidden_size"])?;
    let num_layers = k.positive(&["num_hidden_layers"])?;
    let vocab_size = k.positive(&["vocab_size"])?;
    let rms_norm_eps = k.f32_opt(&["rms_norm_eps"])?.unwrap_or(1e-5);
    let max_position_embeddings = k.usize_opt(&["max_position_embeddings", "model_max_length"])?.unwrap_or(1 << 20);
    let tie_word_embeddings = k.bool_opt(&["tie_word_embeddings"])?.unwrap_or(false);
    if tie_word_embeddings {
        return Err(k.invalid("tie_word_embeddings", "tied embeddings are not part of the K3 family; expected false"));
    }

    let activation = match k.str_opt(&["hidden_act"])?.unwrap_or("silu") {
        "situ" => Activation::Situ {
            beta: k.f32_opt(&["activation_situ_beta"])?.unwrap_or(4.0),
            linear_beta: k.f32_opt(&["activation_situ_linear_beta"])?,
        },
        "silu" | "swiglu" => Activation::Silu,
        other => return Err(k.invalid("hidden_act", format!("`{other}` is not supported (situ or silu)"))),
    };
    if let Activation::Situ { beta, linear_beta } = activation {
        if beta <= 0.0 {
            return Err(k.invalid("activation_situ_beta", "must be positive"));
        }
        if linear_beta.is_some_and(|b| b <= 0.0) {
            return Err(k.invalid("activation_situ_linear_beta", "must be positive"));
        }
    }

    let mixers = parse_mixers(k, num_layers)?;
    let ffns = parse_ffns(k, num_layers)?;
    let layers: Vec<LayerSpec> = mixers.into_iter().zip(ffns).map(|(mixer, ffn)| LayerSpec { mixer, ffn }).collect();
    let has = |m: Mixer| layers.iter().any(|l| l.mixer == m);

    let kda = if has(Mixer::Kda) { Some(parse_kda(k, architecture)?) } else { None };
    let mla = if has(Mixer::Global) { Some(parse_mla(k, architecture)?) } else { None };
    let indexer = match (&mla, k.obj.contains_key("index_topk")) {
        (Some(_), true) => Some(parse_indexer(k)?),
        _ => None,
    };
    let intermediate_size = if layers.iter().any(|l| l.ffn == Ffn::Dense) {
        k.positive(&["intermediate_size"])?
    } else {
        k.usize_opt(&["intermediate_size"])?.unwrap_or(0)
    };
    let moe = if layers.iter().any(|l| l.ffn == Ffn::Moe) { Some(parse_moe(k, hidden_size)?) } else { None };

    let attn_res_block_size = match k.usize_opt(&["attn_res_block_size"])? {
        Some(0) => return Err(k.invalid("attn_res_block_size", "must be at least 1")),
        other => other,
    };
    if architecture != Architecture::KimiLinear && attn_res_block_size.is_none() {
        return Err(ConfigError::Missing { key: k.path("attn_res_block_size") });
    }

    let id = |key: &str| -> Result<Option<u32>> {
        match k.token_id(key)? {
            Some(v) => Ok(Some(v)),
            None => outer.token_id(key),
        }
    };
    // Small test models often keep the full model's special ids; an id the vocabulary
    // cannot hold is dropped with a note instead of being used.
    let mut notes = Vec::new();
    let mut special = |key: &str| -> Result<Option<u32>> {
        Ok(id(key)?.filter(|&v| {
            let ok = (v as usize) < vocab_size;
            if !ok {
                notes.push(format!("{key} {v} is outside the vocabulary of {vocab_size} and is ignored"));
            }
            ok
        }))
    };
    let (bos_token_id, eos_token_id, pad_token_id) =
        (special("bos_token_id")?, special("eos_token_id")?, special("pad_token_id")?);

    Ok(ModelConfig {
        architecture,
        vocab_size,
        hidden_size,
        rms_norm_eps,
        max_position_embeddings,
        tie_word_embeddings,
        activation,
        intermediate_size,
        layers,
        kda,
        mla,
        indexer,
        moe,
        attn_res_block_size,
        bos_token_id,
        eos_token_id,
        pad_token_id,
        notes,
    })
}

/// Which layers are KDA and which are global, from `linear_attn_config` (1-based lists)
/// or transformers' `layer_types`.
fn parse_mixers(k: &Keys, n: usize) -> Result<Vec<Mixer>> {
    if let Some(types) = k.array("layer_types")? {
        if types.len() != n {
            return Err(k.invalid(
                "layer_types",
                format!("lists {} layers but num_hidden_layers is {n}", types.len()),
            ));
        }
        return types
            .iter()
            .enumerate()
            .map(|(i, t)| match t.as_str() {
                Some("linear_attention") | Some("kda") => Ok(Mixer::Kda),
                Some("full_attention") | Some("indexed_attention") => Ok(Mixer::Global),
                _ => Err(ConfigError::Invalid {
                    key: format!("{}[{i}]", k.path("layer_types")),
                    reason: format!("`{t}` is not linear_attention or full_attention"),
                }),
            })
            .collect();
    }
    let lin = k.object("linear_attn_config")?.ok_or(ConfigError::Missing { key: k.path("linear_attn_config") })?;
    let list = |key: &str| -> Result<Option<Vec<usize>>> {
        let Some(a) = lin.array(key)? else { return Ok(None) };
        a.iter()
            .enumerate()
            .map(|(i, v)| match v.as_u64() {
                Some(x) if x >= 1 && (x as usize) <= n => Ok(x as usize - 1),
                _ => Err(ConfigError::Invalid {
                    key: format!("{}[{i}]", lin.path(key)),
                    reason: format!("{v} is not a 1-based layer index in 1..={n}"),
                }),
            })
            .collect::<Result<Vec<_>>>()
            .map(Some)
    };
    let kda = list("kda_layers")?;
    let full = list("full_attn_layers")?;
    let mut out: Vec<Option<Mixer>> = vec![None; n];
    let mut mark = |layers: &[usize], m: Mixer, key: &str| -> Result<()> {
        for &l in layers {
            if out[l].is_some() {
                return Err(lin.invalid(key, format!("layer {} (1-based) is listed twice", l + 1)));
            }
            out[l] = Some(m);
        }
        Ok(())
    };
    match (kda, full) {
        (None, None) => return Err(ConfigError::Missing { key: lin.path("kda_layers") }),
        (Some(kd), Some(fu)) => {
            mark(&kd, Mixer::Kda, "kda_layers")?;
            mark(&fu, Mixer::Global, "full_attn_layers")?;
            if let Some(l) = out.iter().position(|m| m.is_none()) {
                return Err(lin.invalid(
                    "kda_layers",
                    format!("layer {} (1-based) is in neither kda_layers nor full_attn_layers", l + 1),
                ));
            }
        }
        // One list given: every other layer is of the other kind.
        (Some(kd), None) => {
            mark(&kd, Mixer::Kda, "kda_layers")?;
            out.iter_mut().filter(|m| m.is_none()).for_each(|m| *m = Some(Mixer::Global));
        }
        (None, Some(fu)) => {
            mark(&fu, Mixer::Global, "full_attn_layers")?;
            out.iter_mut().filter(|m| m.is_none()).for_each(|m| *m = Some(Mixer::Kda));
        }
    }
    Ok(out.into_iter().map(|m| m.unwrap_or(Mixer::Kda)).collect())
}

/// Dense or MoE per layer, from `mlp_layer_types` or `first_k_dense_replace` + `moe_layer_freq`.
fn parse_ffns(k: &Keys, n: usize) -> Result<Vec<Ffn>> {
    if let Some(types) = k.array("mlp_layer_types")? {
        if types.len() != n {
            return Err(k.invalid(
                "mlp_layer_types",
                format!("lists {} layers but num_hidden_layers is {n}", types.len()),
            ));
        }
        return types
            .iter()
            .enumerate()
            .map(|(i, t)| match t.as_str() {
                Some("dense") => Ok(Ffn::Dense),
                Some("sparse") | Some("moe") => Ok(Ffn::Moe),
                _ => Err(ConfigError::Invalid {
                    key: format!("{}[{i}]", k.path("mlp_layer_types")),
                    reason: format!("`{t}` is not dense or sparse"),
                }),
            })
            .collect();
    }
    let has_experts = k.usize_opt(&["num_experts", "num_local_experts", "n_routed_experts"])?.unwrap_or(0) > 0;
    let first_dense = k.usize_opt(&["first_k_dense_replace"])?.unwrap_or(if has_experts { 0 } else { n });
    if first_dense > n {
        return Err(k.invalid("first_k_dense_replace", format!("{first_dense} exceeds num_hidden_layers {n}")));
    }
    let freq = k.usize_opt(&["moe_layer_freq"])?.unwrap_or(1);
    if freq == 0 {
        return Err(k.invalid("moe_layer_freq", "must be at least 1"));
    }
    Ok((0..n).map(|l| if l >= first_dense && l % freq == 0 && has_experts { Ffn::Moe } else { Ffn::Dense }).collect())
}

fn parse_kda(k: &Keys, arch: Architecture) -> Result<KdaConfig> {
    let lin = k.object("linear_attn_config")?;
    // transformers spells these linear_*; Moonshot nests them in linear_attn_config.
    let (num_heads, head_dim, conv_kernel, lower_bound, full_rank) = match &lin {
        Some(lin) => (
            lin.positive(&["num_heads"])?,
            lin.positive(&["head_dim"])?,
            lin.usize_opt(&["short_conv_kernel_size"])?.unwrap_or(4),
            lin.f32_opt(&["gate_lower_bound"])?,
            lin.bool_opt(&["use_full_rank_gate"])?,
        ),
        None => (
            k.positive(&["linear_num_heads"])?,
            k.positive(&["linear_head_dim"])?,
            k.usize_opt(&["linear_conv_kernel_dim"])?.unwrap_or(4),
            k.f32_opt(&["gate_lower_bound"])?,
            k.bool_opt(&["use_full_rank_gate"])?,
        ),
    };
    let lin_path = |key: &str| match &lin {
        Some(l) => l.path(key),
        None => k.path(key),
    };
    if head_dim % 16 != 0 || head_dim > 256 {
        return Err(ConfigError::Invalid {
            key: lin_path("head_dim"),
            reason: format!("{head_dim} must be a multiple of 16 and at most 256 (KDA kernel tiles)"),
        });
    }
    if conv_kernel < 1 {
        return Err(ConfigError::Invalid { key: lin_path("short_conv_kernel_size"), reason: "must be at least 1".into() });
    }
    let gate = match lower_bound {
        Some(lb) if lb < 0.0 => KdaGate::Bounded { lower_bound: lb },
        Some(lb) => {
            return Err(ConfigError::Invalid {
                key: lin_path("gate_lower_bound"),
                reason: format!("{lb} must be negative (log-space decay)"),
            });
        }
        None if arch == Architecture::KimiLinear => KdaGate::Softplus,
        None => return Err(ConfigError::Missing { key: lin_path("gate_lower_bound") }),
    };
    let output_gate = match full_rank {
        Some(true) => KdaOutputGate::FullRank,
        Some(false) => KdaOutputGate::LowRank,
        None if arch == Architecture::KimiLinear => KdaOutputGate::LowRank,
        None => KdaOutputGate::FullRank,
    };
    Ok(KdaConfig { num_heads, head_dim, conv_kernel, gate, output_gate })
}

fn parse_mla(k: &Keys, arch: Architecture) -> Result<MlaConfig> {
    let num_heads = k.positive(&["num_attention_heads"])?;
    if let Some(kv) = k.usize_opt(&["num_key_value_heads"])? {
        if kv != num_heads {
            return Err(k.invalid(
                "num_key_value_heads",
                format!("{kv} differs from num_attention_heads {num_heads}; MLA has one latent shared by all heads"),
            ));
        }
    }
    let q_lora_rank = match k.usize_opt(&["q_lora_rank"])? {
        Some(0) => return Err(k.invalid("q_lora_rank", "must be at least 1, or null for a plain q_proj")),
        r => r,
    };
    let kv_lora_rank = k.positive(&["kv_lora_rank"])?;
    let qk_nope_head_dim = k.positive(&["qk_nope_head_dim"])?;
    let qk_rope_head_dim = k.usize(&["qk_rope_head_dim"])?;
    let v_head_dim = k.positive(&["v_head_dim"])?;
    if k.bool_opt(&["mla_use_nope"])? == Some(false) && qk_rope_head_dim > 0 {
        return Err(k.invalid("mla_use_nope", "rotary MLA is not part of the K3 family; expected true (NoPE)"));
    }
    let output_gate = match k.bool_opt(&["mla_use_output_gate"])? {
        Some(g) => g,
        None => arch != Architecture::KimiLinear,
    };
    Ok(MlaConfig {
        num_heads,
        q_lora_rank,
        kv_lora_rank,
        qk_nope_head_dim,
        qk_rope_head_dim,
        v_head_dim,
        output_gate,
        latent_norm_eps: k.f32_opt(&["mla_norm_eps"])?.unwrap_or(1e-6),
    })
}

fn parse_indexer(k: &Keys) -> Result<IndexerConfig> {
    let n_heads = k.positive(&["index_n_heads"])?;
    let head_dim = k.positive(&["index_head_dim"])?;
    let topk = k.positive(&["index_topk"])?;
    if let Some(r) = k.usize_opt(&["index_rope_dim"])? {
        if r != 0 {
            return Err(k.invalid("index_rope_dim", format!("{r}: K3.1's indexer has no rotary part; only 0 is supported")));
        }
    }
    if k.bool_opt(&["index_use_hadamard"])? == Some(true) {
        return Err(k.invalid("index_use_hadamard", "the Hadamard-rotated indexer is not supported; expected false"));
    }
    if let Some(f) = k.usize_opt(&["index_topk_freq"])? {
        if f != 1 {
            return Err(k.invalid("index_topk_freq", format!("{f}: only 1 (every global layer runs its own indexer) is supported")));
        }
    }
    if k.obj.contains_key("index_skip_topk_offset") {
        return Err(k.invalid("index_skip_topk_offset", "index sharing across layers is not supported"));
    }
    if let Some(t) = k.usize_opt(&["index_select_tail"])? {
        if t != 0 {
            return Err(k.invalid("index_select_tail", "forced tail selection is not supported; expected 0"));
        }
    }
    Ok(IndexerConfig { n_heads, head_dim, topk, key_norm_eps: 1e-6 })
}

fn parse_moe(k: &Keys, hidden: usize) -> Result<MoeConfig> {
    let num_experts = k.positive(&["num_experts", "num_local_experts", "n_routed_experts"])?;
    let experts_per_token = k.positive(&["num_experts_per_token", "num_experts_per_tok"])?;
    if experts_per_token > num_experts {
        return Err(k.invalid(
            "num_experts_per_token",
            format!("{experts_per_token} exceeds num_experts {num_experts}"),
        ));
    }
    let num_shared_experts = k.usize_opt(&["num_shared_experts", "n_shared_experts"])?.unwrap_or(0);
    let moe_intermediate_size = k.positive(&["moe_intermediate_size"])?;
    let latent_size = match k.usize_opt(&["routed_expert_hidden_size"])? {
        Some(0) => return Err(k.invalid("routed_expert_hidden_size", "must be at least 1")),
        Some(l) if l == hidden => None,
        other => other,
    };
    let latent_norm = latent_size.is_some() && k.bool_opt(&["latent_moe_use_norm"])?.unwrap_or(true);

    if let Some(f) = k.str_opt(&["moe_router_activation_func", "scoring_func"])? {
        if f != "sigmoid" {
            return Err(k.invalid("moe_router_activation_func", format!("`{f}` is not supported; expected sigmoid")));
        }
    }
    let grouped = k.bool_opt(&["use_grouped_topk"])?.unwrap_or(true);
    let num_expert_group = if grouped { k.usize_opt(&["num_expert_group", "n_group"])?.unwrap_or(1) } else { 1 };
    let topk_group = if grouped { k.usize_opt(&["topk_group"])?.unwrap_or(num_expert_group) } else { 1 };
    if num_expert_group == 0 || num_experts % num_expert_group != 0 {
        return Err(k.invalid(
            "num_expert_group",
            format!("{num_expert_group} groups do not divide {num_experts} experts"),
        ));
    }
    if topk_group == 0 || topk_group > num_expert_group {
        return Err(k.invalid("topk_group", format!("{topk_group} must be in 1..={num_expert_group}")));
    }
    if num_expert_group > 1 && topk_group * (num_experts / num_expert_group) < experts_per_token {
        return Err(k.invalid("topk_group", "the kept groups hold fewer experts than num_experts_per_token"));
    }
    let router = RouterConfig {
        num_expert_group,
        topk_group,
        renormalize: k.bool_opt(&["moe_renormalize", "norm_topk_prob"])?.unwrap_or(true),
        routed_scaling_factor: k.f32_opt(&["routed_scaling_factor"])?.unwrap_or(1.0),
    };

    let expert_format = match k.object("quantization_config")? {
        None => ExpertFormat::Bf16,
        Some(q) => parse_quantization(&q)?,
    };
    let io = latent_size.unwrap_or(hidden);
    if expert_format == ExpertFormat::Mxfp4 {
        for (key, v) in [("routed_expert_hidden_size", io), ("moe_intermediate_size", moe_intermediate_size)] {
            if v % 32 != 0 {
                return Err(k.invalid(key, format!("{v} is not a multiple of the MXFP4 group size 32")));
            }
        }
    }
    Ok(MoeConfig {
        num_experts,
        experts_per_token,
        num_shared_experts,
        moe_intermediate_size,
        latent_size,
        latent_norm,
        router,
        expert_format,
    })
}

fn parse_quantization(q: &Keys) -> Result<ExpertFormat> {
    let method = q.str_opt(&["quant_method"])?.ok_or(ConfigError::Missing { key: q.path("quant_method") })?;
    if method != "compressed-tensors" {
        return Err(q.invalid("quant_method", format!("`{method}` is not supported; expected compressed-tensors")));
    }
    let format = q.str_opt(&["format"])?;
    if format.is_some_and(|f| f != "mxfp4-pack-quantized") {
        return Err(q.invalid("format", format!("`{}` is not supported; expected mxfp4-pack-quantized", format.unwrap_or_default())));
    }
    if let Some(scheme) = q.obj.get("kv_cache_scheme").filter(|v| !v.is_null()) {
        return Err(q.invalid("kv_cache_scheme", format!("quantised caches ({scheme}) are not supported; expected null")));
    }
    if let Some(groups) = q.object("config_groups")? {
        for (name, _) in groups.obj.iter() {
            let g = groups.object(name)?.ok_or(ConfigError::Missing { key: groups.path(name) })?;
            if let Some(f) = g.str_opt(&["format"])? {
                if f != "mxfp4-pack-quantized" {
                    return Err(g.invalid("format", format!("`{f}` is not supported; expected mxfp4-pack-quantized")));
                }
            }
            if let Some(w) = g.object("weights")? {
                if let Some(b) = w.usize_opt(&["num_bits"])? {
                    if b != 4 {
                        return Err(w.invalid("num_bits", format!("{b}: only 4-bit MXFP4 is supported")));
                    }
                }
                if let Some(gs) = w.usize_opt(&["group_size"])? {
                    if gs != 32 {
                        return Err(w.invalid("group_size", format!("{gs}: MXFP4 uses groups of 32")));
                    }
                }
            }
            if g.obj.get("input_activations").is_some_and(|v| !v.is_null()) {
                return Err(g.invalid("input_activations", "activation quantisation is not supported; expected null"));
            }
        }
    }
    Ok(ExpertFormat::Mxfp4)
}
