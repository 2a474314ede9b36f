//! The tensors a config implies: names, shapes and dtypes, in one list.
//!
//! The checkpoint validator, `k31 inspect` (parameter and byte counts) and `k31 init`
//! (what to write) all read this list, so the three can never disagree. Names are the
//! canonical spelling without the `language_model.` prefix (docs/formats.md).

use crate::config::{Activation, ExpertFormat, Ffn, KdaOutputGate, Mixer, ModelConfig};

/// Storage type of a checkpoint tensor.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum DType {
    BF16,
    F16,
    F32,
    U8,
    I32,
    I64,
    Other,
}

impl DType {
    pub fn size(self) -> usize {
        match self {
            DType::BF16 | DType::F16 => 2,
            DType::F32 | DType::I32 => 4,
            DType::U8 | DType::Other => 1,
            DType::I64 => 8,
        }
    }
    pub fn is_float(self) -> bool {
        matches!(self, DType::BF16 | DType::F16 | DType::F32)
    }
    pub fn name(self) -> &'static str {
        match self {
            DType::BF16 => "bf16",
            DType::F16 => "f16",
            DType::F32 => "f32",
            DType::U8 => "u8",
            DType::I32 => "i32",
            DType::I64 => "i64",
            DType::Other => "other",
        }
    }
}

/// Which dtypes a tensor may have in a file.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum DTypeRule {
    /// Any of bf16, f16, f32: weights stay in their checkpoint dtype.
    Float,
    /// MXFP4 planes (`weight_packed`, `weight_scale`).
    U8,
}

impl DTypeRule {
    pub fn accepts(self, d: DType) -> bool {
        match self {
            DTypeRule::Float => d.is_float(),
            DTypeRule::U8 => d == DType::U8,
        }
    }
    pub fn describe(self) -> &'static str {
        match self {
            DTypeRule::Float => "bf16, f16 or f32",
            DTypeRule::U8 => "u8",
        }
    }
}

/// Which shapes a tensor may have.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShapeRule {
    Exact(Vec<usize>),
    /// Any shape with at least this many elements; the first ones are used
    /// (`A_log`: [H], [1,1,H,1] or a longer vector, spec Q5).
    AtLeast(usize),
}

impl ShapeRule {
    pub fn accepts(&self, shape: &[usize]) -> bool {
        match self {
            ShapeRule::Exact(s) => s.as_slice() == shape,
            ShapeRule::AtLeast(n) => shape.iter().product::<usize>() >= *n,
        }
    }
    pub fn describe(&self) -> String {
        match self {
            ShapeRule::Exact(s) => format!("{s:?}"),
            ShapeRule::AtLeast(n) => format!("any shape with >= {n} elements"),
        }
    }
    /// The shape `k31 init` writes.
    pub fn canonical(&self) -> Vec<usize> {
        match self {
            ShapeRule::Exact(s) => s.clone(),
            ShapeRule::AtLeast(n) => vec![*n],
        }
    }
}

/// What a tensor is for; drives parameter accounting and `k31 init`'s initialisation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
pub enum Role {
    Embedding,
    Head,
    /// RMSNorm / LayerNorm weights (initialised to 1).
    Norm,
    /// LayerNorm bias (initialised to 0).
    NormBias,
    /// AttnRes pseudo-query projections.
    ResProj,
    Projection,
    /// Depthwise causal conv weights [C, 1, W].
    Conv,
    /// KDA per-head log rate.
    ALog,
    /// KDA per-channel gate bias.
    DtBias,
    RouterBias,
    /// Routed expert MXFP4 nibbles.
    ExpertPacked,
    /// Routed expert E8M0 scales.
    ExpertScale,
    /// Routed expert weights stored as plain floats (Kimi Linear).
    ExpertDense,
}

#[derive(Clone, Debug)]
pub struct TensorSpec {
    pub name: String,
    /// Other spellings seen in the wild for the same tensor.
    pub aliases: Vec<String>,
    pub shape: ShapeRule,
    pub dtype: DTypeRule,
    pub role: Role,
    /// The layer it belongs to, if any.
    pub layer: Option<usize>,
    /// (expert index) for routed-expert tensors.
    pub expert: Option<usize>,
    /// Logical parameters (MXFP4: two per packed byte; scales count zero).
    pub params: usize,
    /// A checkpoint may omit it (the loader substitutes the documented default).
    pub optional: bool,
    /// The dtype `k31 init` writes and a config-only plan assumes (spec 7.3: conv, A_log,
    /// dt_bias, router bias and the index-key LayerNorm are f32; MXFP4 planes u8; rest bf16).
    pub canonical: DType,
}

impl TensorSpec {
    fn new(name: String, shape: Vec<usize>, dtype: DTypeRule, role: Role) -> Self {
        let numel: usize = shape.iter().product();
        let params = match role {
            Role::ExpertPacked => numel * 2,
            Role::ExpertScale => 0,
            _ => numel,
        };
        let canonical = match (dtype, role) {
            (DTypeRule::U8, _) => DType::U8,
            (_, Role::Conv | Role::ALog | Role::DtBias | Role::RouterBias | Role::NormBias) => DType::F32,
            _ => DType::BF16,
        };
        TensorSpec {
            name,
            aliases: Vec::new(),
            shape: ShapeRule::Exact(shape),
            dtype,
            role,
            layer: None,
            expert: None,
            params,
            canonical,
            optional: false,
        }
    }
    fn f32(mut self) -> Self {
        self.canonical = DType::F32;
        self
    }
    fn float(name: String, shape: Vec<usize>, role: Role) -> Self {
        Self::new(name, shape, DTypeRule::Float, role)
    }
    fn in_layer(mut self, l: usize) -> Self {
        self.layer = Some(l);
        self
    }
    fn alias(mut self, a: String) -> Self {
        self.aliases.push(a);
        self
    }
    /// Bytes of the canonical file tensor.
    pub fn canonical_bytes(&self) -> usize {
        self.shape.canonical().iter().product::<usize>() * self.canonical.size()
    }
}

/// The full list of tensors the text model needs, in a stable order.
pub fn expected_tensors(cfg: &ModelConfig) -> Vec<TensorSpec> {
    let d = cfg.hidden_size;
    let mut out = vec![
        TensorSpec::float("model.embed_tokens.weight".into(), vec![cfg.vocab_size, d], Role::Embedding),
    ];
    let attn_res = cfg.attn_res_block_size.is_some();
    for (l, spec) in cfg.layers.iter().enumerate() {
        let p = format!("model.layers.{l}.");
        let mut push = |t: TensorSpec| out.push(t.in_layer(l));
        push(TensorSpec::float(format!("{p}input_layernorm.weight"), vec![d], Role::Norm));
        push(TensorSpec::float(format!("{p}post_attention_layernorm.weight"), vec![d], Role::Norm));
        if attn_res {
            for side in ["self_attention", "mlp"] {
                push(TensorSpec::float(format!("{p}{side}_res_norm.weight"), vec![d], Role::Norm));
                push(TensorSpec::float(format!("{p}{side}_res_proj.weight"), vec![1, d], Role::ResProj));
            }
        }
        match spec.mixer {
            Mixer::Kda => kda_tensors(cfg, &p, &mut push),
            Mixer::Global => global_tensors(cfg, &p, &mut push),
        }
        match spec.ffn {
            Ffn::Dense => {
                let i = cfg.intermediate_size;
                for (n, shape) in [("gate_proj", vec![i, d]), ("up_proj", vec![i, d]), ("down_proj", vec![d, i])] {
                    // transformers' save_pretrained writes Kimi Linear's dense MLP under block_sparse_moe.
                    push(
                        TensorSpec::float(format!("{p}mlp.{n}.weight"), shape, Role::Projection)
                            .alias(format!("{p}block_sparse_moe.{n}.weight")),
                    );
                }
            }
            Ffn::Moe => moe_tensors(cfg, &p, &mut push),
        }
    }
    out.push(TensorSpec::float("model.norm.weight".into(), vec![d], Role::Norm));
    if attn_res {
        out.push(TensorSpec::float("model.output_attn_res_norm.weight".into(), vec![d], Role::Norm));
        out.push(TensorSpec::float("model.output_attn_res_proj.weight".into(), vec![1, d], Role::ResProj));
    }
    out.push(TensorSpec::float("lm_head.weight".into(), vec![cfg.vocab_size, d], Role::Head));
    out
}

fn kda_tensors(cfg: &ModelConfig, p: &str, push: &mut impl FnMut(TensorSpec)) {
    let Some(kda) = &cfg.kda else { return };
    let (d, h, k, w) = (cfg.hidden_size, kda.num_heads, kda.head_dim, kda.conv_kernel);
    let pd = kda.proj_dim();
    let a = format!("{p}self_attn.");
    for n in ["q", "k", "v"] {
        push(TensorSpec::float(format!("{a}{n}_proj.weight"), vec![pd, d], Role::Projection));
        push(TensorSpec::float(format!("{a}{n}_conv1d.weight"), vec![pd, 1, w], Role::Conv));
    }
    push(TensorSpec::float(format!("{a}f_a_proj.weight"), vec![k, d], Role::Projection));
    push(TensorSpec::float(format!("{a}f_b_proj.weight"), vec![pd, k], Role::Projection));
    push(TensorSpec::float(format!("{a}dt_bias"), vec![pd], Role::DtBias));
    let mut a_log = TensorSpec::float(format!("{a}A_log"), vec![h], Role::ALog);
    a_log.shape = ShapeRule::AtLeast(h);
    push(a_log);
    push(TensorSpec::float(format!("{a}b_proj.weight"), vec![h, d], Role::Projection));
    match kda.output_gate {
        KdaOutputGate::FullRank => push(TensorSpec::float(format!("{a}g_proj.weight"), vec![pd, d], Role::Projection)),
        KdaOutputGate::LowRank => {
            push(TensorSpec::float(format!("{a}g_a_proj.weight"), vec![k, d], Role::Projection));
            push(TensorSpec::float(format!("{a}g_b_proj.weight"), vec![pd, k], Role::Projection));
        }
    }
    push(TensorSpec::float(format!("{a}o_norm.weight"), vec![k], Role::Norm));
    push(TensorSpec::float(format!("{a}o_proj.weight"), vec![d, pd], Role::Projection));
}

fn global_tensors(cfg: &ModelConfig, p: &str, push: &mut impl FnMut(TensorSpec)) {
    let Some(mla) = &cfg.mla else { return };
    let d = cfg.hidden_size;
    let h = mla.num_heads;
    let a = format!("{p}self_attn.");
    let q_out = h * mla.qk_head_dim();
    match mla.q_lora_rank {
        Some(r) => {
            push(TensorSpec::float(format!("{a}q_a_proj.weight"), vec![r, d], Role::Projection));
            push(TensorSpec::float(format!("{a}q_a_layernorm.weight"), vec![r], Role::Norm));
            push(TensorSpec::float(format!("{a}q_b_proj.weight"), vec![q_out, r], Role::Projection));
        }
        None => push(TensorSpec::float(format!("{a}q_proj.weight"), vec![q_out, d], Role::Projection)),
    }
    push(TensorSpec::float(format!("{a}kv_a_proj_with_mqa.weight"), vec![mla.cache_row(), d], Role::Projection));
    push(TensorSpec::float(format!("{a}kv_a_layernorm.weight"), vec![mla.kv_lora_rank], Role::Norm));
    push(TensorSpec::float(
        format!("{a}kv_b_proj.weight"),
        vec![h * (mla.qk_nope_head_dim + mla.v_head_dim), mla.kv_lora_rank],
        Role::Projection,
    ));
    if mla.output_gate {
        push(TensorSpec::float(format!("{a}g_proj.weight"), vec![h * mla.v_head_dim, d], Role::Projection));
    }
    push(TensorSpec::float(format!("{a}o_proj.weight"), vec![d, h * mla.v_head_dim], Role::Projection));
    if let Some(ix) = &cfg.indexer {
        // The indexer query reads the q latent; a config without q_lora feeds it x.
        let q_in = mla.q_lora_rank.unwrap_or(d);
        let i = format!("{a}indexer.");
        push(TensorSpec::float(format!("{i}wq_b.weight"), vec![ix.n_heads * ix.head_dim, q_in], Role::Projection));
        push(TensorSpec::float(format!("{i}wk.weight"), vec![ix.head_dim, d], Role::Projection));
        push(TensorSpec::float(format!("{i}k_norm.weight"), vec![ix.head_dim], Role::Norm).f32());
        // Spec Q2: a checkpoint without the index-key LayerNorm bias uses zeros.
        let mut bias = TensorSpec::float(format!("{i}k_norm.bias"), vec![ix.head_dim], Role::NormBias);
        bias.optional = true;
        push(bias);
        push(TensorSpec::float(format!("{i}weights_proj.weight"), vec![ix.n_heads, d], Role::Projection));
    }
}

fn moe_tensors(cfg: &ModelConfig, p: &str, push: &mut impl FnMut(TensorSpec)) {
    let Some(moe) = &cfg.moe else { return };
    let d = cfg.hidden_size;
    let m = format!("{p}block_sparse_moe.");
    push(TensorSpec::float(format!("{m}gate.weight"), vec![moe.num_experts, d], Role::Projection));
    push(TensorSpec::float(format!("{m}gate.e_score_correction_bias"), vec![moe.num_experts], Role::RouterBias));
    let io = moe.expert_io(d);
    let ie = moe.moe_intermediate_size;
    if let Some(lat) = moe.latent_size {
        push(TensorSpec::float(format!("{m}routed_expert_down_proj.weight"), vec![lat, d], Role::Projection));
        if moe.latent_norm {
            push(TensorSpec::float(format!("{m}routed_expert_norm.weight"), vec![lat], Role::Norm));
        }
        push(TensorSpec::float(format!("{m}routed_expert_up_proj.weight"), vec![d, lat], Role::Projection));
    }
    for e in 0..moe.num_experts {
        for (w, rows, cols) in [("w1", ie, io), ("w3", ie, io), ("w2", io, ie)] {
            let x = format!("{m}experts.{e}.{w}");
            let mut ts = match moe.expert_format {
                ExpertFormat::Mxfp4 => vec![
                    TensorSpec::new(format!("{x}.weight_packed"), vec![rows, cols / 2], DTypeRule::U8, Role::ExpertPacked),
                    TensorSpec::new(format!("{x}.weight_scale"), vec![rows, cols / 32], DTypeRule::U8, Role::ExpertScale),
                ],
                ExpertFormat::Bf16 => vec![TensorSpec::float(format!("{x}.weight"), vec![rows, cols], Role::ExpertDense)],
            };
            for mut t in ts.drain(..) {
                t.expert = Some(e);
                push(t);
            }
        }
    }
    if moe.num_shared_experts > 0 {
        let s = moe.num_shared_experts * ie;
        let sh = format!("{m}shared_experts.");
        push(TensorSpec::float(format!("{sh}gate_proj.weight"), vec![s, d], Role::Projection));
        push(TensorSpec::float(format!("{sh}up_proj.weight"), vec![s, d], Role::Projection));
        push(TensorSpec::float(format!("{sh}down_proj.weight"), vec![d, s], Role::Projection));
    }
}

/// Parameter and byte accounting derived from [`expected_tensors`].
#[derive(Clone, Debug, Default, serde::Serialize)]
pub struct ParamCounts {
    pub total: usize,
    /// Parameters one token touches: everything but the routed experts it does not select
    /// and the embedding rows it does not read.
    pub active_per_token: usize,
    pub embedding: usize,
    pub routed_experts: usize,
}

pub fn param_counts(cfg: &ModelConfig, specs: &[TensorSpec]) -> ParamCounts {
    let mut c = ParamCounts::default();
    let mut per_expert_layer = 0usize; // routed-expert params in all MoE layers
    for t in specs {
        c.total += t.params;
        match t.role {
            Role::Embedding => c.embedding += t.params,
            Role::ExpertPacked | Role::ExpertScale | Role::ExpertDense => per_expert_layer += t.params,
            _ => {}
        }
    }
    c.routed_experts = per_expert_layer;
    let active_experts = match &cfg.moe {
        Some(m) => per_expert_layer / m.num_experts * m.experts_per_token,
        None => 0,
    };
    c.active_per_token = c.total - c.embedding - per_expert_layer + active_experts + cfg.hidden_size;
    c
}

/// Whether an activation needs the `up` branch bound (SiTU) — kept here so inspect can
/// print the MLP form without reaching into the kernels.
pub fn activation_name(a: &Activation) -> String {
    match a {
        Activation::Situ { beta, linear_beta: Some(lb) } => format!("SiTU-GLU (beta {beta}, linear beta {lb})"),
        Activation::Situ { beta, linear_beta: None } => format!("SiTU-GLU (beta {beta})"),
        Activation::Silu => "SiLU-GLU".into(),
    }
}
