//! CPU reference of the DSA global layer (spec 5): lightning-indexer scores, causal top-k with
//! the tie rule, sparse MLA in the materialised and the absorbed form, and the whole layer
//! over a growing cache. f64 accumulation, obviously right and slow.

use half::bf16;

fn bf(x: f64) -> f64 {
    bf16::from_f64(x).to_f64()
}

/// I[t, s] = w_scale * sum_j w[t,j] relu(q[t,j] . k[s]) for s <= q_pos0 + t, -inf beyond.
/// q: [T, heads, head_dim]; w: [T, heads] (raw); keys: [n_pos, head_dim]. Returns [T, n_pos].
#[allow(clippy::too_many_arguments)]
pub fn index_scores(
    q: &[f32],
    w: &[f32],
    keys: &[f32],
    heads: usize,
    head_dim: usize,
    n_queries: usize,
    q_pos0: usize,
    n_pos: usize,
) -> Vec<f64> {
    let w_scale = ((heads * head_dim) as f64).powf(-0.5);
    let mut out = vec![f64::NEG_INFINITY; n_queries * n_pos];
    for t in 0..n_queries {
        for s in 0..n_pos.min(q_pos0 + t + 1) {
            let k = &keys[s * head_dim..(s + 1) * head_dim];
            let mut acc = 0f64;
            for j in 0..heads {
                let qj = &q[(t * heads + j) * head_dim..(t * heads + j + 1) * head_dim];
                let d: f64 = qj.iter().zip(k).map(|(&a, &b)| a as f64 * b as f64).sum();
                acc += w[t * heads + j] as f64 * w_scale * d.max(0.0);
            }
            out[t * n_pos + s] = acc;
        }
    }
    out
}

/// Positions of the k largest of `row[0..valid]`, score descending then position ascending;
/// all valid positions when valid <= k.
pub fn topk(row: &[f64], valid: usize, k: usize) -> Vec<usize> {
    let mut idx: Vec<usize> = (0..valid.min(row.len())).collect();
    idx.sort_by(|&a, &b| row[b].total_cmp(&row[a]).then(a.cmp(&b)));
    idx.truncate(k);
    idx
}

/// MLA dimensions (mirrors ops::dsa::MlaDims without the GPU types).
#[derive(Clone, Copy, Debug)]
pub struct Dims {
    pub heads: usize,
    pub latent: usize,
    pub rope: usize,
    pub nope: usize,
    pub v_dim: usize,
    pub scale: f64,
}

/// Materialised sparse MLA for one query: k_nope = W_UK c_s, v = W_UV c_s per head,
/// softmax over `sel` of scale (q_nope . k_nope + q_pe . k_pe). q: [H*(nope+rope)];
/// cache: rows of latent + rope; wkv: [H*(nope+v), latent]. Returns (o [H, v], lse [H]).
pub fn sparse_mla(d: &Dims, q: &[f32], cache: &[f32], wkv: &[f32], sel: &[usize]) -> (Vec<f64>, Vec<f64>) {
    let width = d.latent + d.rope;
    let mut o = vec![0f64; d.heads * d.v_dim];
    let mut lse = vec![f64::NEG_INFINITY; d.heads];
    for h in 0..d.heads {
        let qh = &q[h * (d.nope + d.rope)..(h + 1) * (d.nope + d.rope)];
        let row = |r: usize| &wkv[r * d.latent..(r + 1) * d.latent];
        let proj = |r: usize, c: &[f32]| -> f64 { row(r).iter().zip(c).map(|(&a, &b)| a as f64 * b as f64).sum() };
        let mut logits = Vec::with_capacity(sel.len());
        let mut values = Vec::with_capacity(sel.len());
        for &s in sel {
            let cs = &cache[s * width..s * width + d.latent];
            let pe = &cache[s * width + d.latent..(s + 1) * width];
            let base = h * (d.nope + d.v_dim);
            let mut l = 0f64;
            for (i, q) in qh[..d.nope].iter().enumerate() {
                l += *q as f64 * proj(base + i, cs);
            }
            for (q, p) in qh[d.nope..d.nope + d.rope].iter().zip(pe) {
                l += *q as f64 * *p as f64;
            }
            logits.push(l * d.scale);
            values.push((0..d.v_dim).map(|v| proj(base + d.nope + v, cs)).collect::<Vec<f64>>());
        }
        let m = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        if m == f64::NEG_INFINITY {
            continue;
        }
        let z: f64 = logits.iter().map(|l| (l - m).exp()).sum();
        lse[h] = m + z.ln();
        for (l, v) in logits.iter().zip(&values) {
            let p = (l - m).exp() / z;
            for (i, x) in v.iter().enumerate() {
                o[h * d.v_dim + i] += p * x;
            }
        }
    }
    (o, lse)
}

/// Absorbed form of [`sparse_mla`]: q~ = W_UK^T q_nope, logits against the 576-wide rows,
/// W_UV applied after the weighted latent sum. Same outputs.
pub fn sparse_mla_absorbed(d: &Dims, q: &[f32], cache: &[f32], wkv: &[f32], sel: &[usize]) -> (Vec<f64>, Vec<f64>) {
    let width = d.latent + d.rope;
    let mut o = vec![0f64; d.heads * d.v_dim];
    let mut lse = vec![f64::NEG_INFINITY; d.heads];
    for h in 0..d.heads {
        let qh = &q[h * (d.nope + d.rope)..(h + 1) * (d.nope + d.rope)];
        let base = h * (d.nope + d.v_dim);
        let mut qa = vec![0f64; width];
        for c in 0..d.latent {
            qa[c] = (0..d.nope).map(|i| qh[i] as f64 * wkv[(base + i) * d.latent + c] as f64).sum();
        }
        for i in 0..d.rope {
            qa[d.latent + i] = qh[d.nope + i] as f64;
        }
        let logits: Vec<f64> = sel
            .iter()
            .map(|&s| d.scale * cache[s * width..(s + 1) * width].iter().zip(&qa).map(|(&c, &a)| c as f64 * a).sum::<f64>())
            .collect();
        let m = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        if m == f64::NEG_INFINITY {
            continue;
        }
        let z: f64 = logits.iter().map(|l| (l - m).exp()).sum();
        lse[h] = m + z.ln();
        let mut ob = vec![0f64; d.latent];
        for (l, &s) in logits.iter().zip(sel) {
            let p = (l - m).exp() / z;
            for c in 0..d.latent {
                ob[c] += p * cache[s * width + c] as f64;
            }
        }
        for v in 0..d.v_dim {
            let r = base + d.nope + v;
            o[h * d.v_dim + v] = (0..d.latent).map(|c| wkv[r * d.latent + c] as f64 * ob[c]).sum();
        }
    }
    (o, lse)
}

/// Weights of one global layer as f32 (bf16 values widened), names as in the checkpoint.
#[derive(Clone, Debug, Default)]
pub struct LayerWeights {
    pub q_a: Option<Vec<f32>>,
    pub q_a_norm: Option<Vec<f32>>,
    pub q_b: Option<Vec<f32>>,
    pub q_proj: Option<Vec<f32>>,
    pub kv_a: Vec<f32>,
    pub kv_a_norm: Vec<f32>,
    pub kv_b: Vec<f32>,
    pub g_proj: Option<Vec<f32>>,
    pub o_proj: Vec<f32>,
    pub indexer: Option<IndexerWeights>,
}

#[derive(Clone, Debug, Default)]
pub struct IndexerWeights {
    pub wq_b: Vec<f32>,
    pub wk: Vec<f32>,
    pub k_norm_w: Vec<f32>,
    pub k_norm_b: Vec<f32>,
    pub weights_proj: Vec<f32>,
}

/// Shapes of one global layer.
#[derive(Clone, Copy, Debug)]
pub struct LayerDims {
    pub hidden: usize,
    pub q_lora: Option<usize>,
    pub mla: Dims,
    pub latent_eps: f64,
    /// (heads, head_dim, topk, eps) of the indexer; None = dense MLA.
    pub indexer: Option<(usize, usize, usize, f64)>,
    /// The indexer's q and head weights rounded to bf16 (`IndexPrecision::Bf16`; from their
    /// f32 values, as the engine rounds them).
    pub index_bf16: bool,
}

/// The reference cache: rows rounded to bf16 as the GPU stores them.
#[derive(Clone, Debug, Default)]
pub struct Cache {
    pub latent: Vec<f32>,
    pub keys: Vec<f32>,
    pub len: usize,
}

/// What one token of the layer produced besides its output.
#[derive(Clone, Debug, Default)]
pub struct TokenTrace {
    pub selected: Vec<usize>,
    pub scores: Vec<f64>,
}

fn linear(w: &[f32], x: &[f64]) -> Vec<f64> {
    let n = x.len();
    w.chunks_exact(n).map(|r| r.iter().zip(x).map(|(&a, &b)| a as f64 * b).sum()).collect()
}

/// RMSNorm of one row (the latent's and c_q's, spec 5.2).
pub fn rms(x: &[f64], g: &[f32], eps: f64) -> Vec<f64> {
    let r = 1.0 / (x.iter().map(|v| v * v).sum::<f64>() / x.len() as f64 + eps).sqrt();
    x.iter().zip(g).map(|(v, &g)| v * r * g as f64).collect()
}

/// LayerNorm of one row (the index key's, spec 2.2).
pub fn layer_norm(x: &[f64], g: &[f32], b: &[f32], eps: f64) -> Vec<f64> {
    let n = x.len() as f64;
    let mean = x.iter().sum::<f64>() / n;
    let var = x.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / n;
    let r = 1.0 / (var + eps).sqrt();
    x.iter().zip(g.iter().zip(b)).map(|(v, (&g, &b))| (v - mean) * r * g as f64 + b as f64).collect()
}

/// The global layer on `x` [T, hidden] at positions cache.len.. : appends to the cache and
/// returns out [T, hidden] and the per-token selections (empty when dense).
pub fn global_layer(d: &LayerDims, w: &LayerWeights, x: &[f32], cache: &mut Cache) -> (Vec<f64>, Vec<TokenTrace>) {
    let m = d.mla;
    let width = m.latent + m.rope;
    let n_tok = x.len() / d.hidden;
    let mut out = Vec::with_capacity(x.len());
    let mut traces = Vec::new();
    for t in 0..n_tok {
        let xt: Vec<f64> = x[t * d.hidden..(t + 1) * d.hidden].iter().map(|&v| v as f64).collect();
        let (q, cq) = match (d.q_lora, &w.q_a, &w.q_a_norm, &w.q_b) {
            (Some(_), Some(qa), Some(qn), Some(qb)) => {
                let cq = rms(&linear(qa, &xt), qn, d.latent_eps);
                (linear(qb, &cq), cq)
            }
            _ => (linear(w.q_proj.as_deref().unwrap_or(&[]), &xt), xt.clone()),
        };
        let kv = linear(&w.kv_a, &xt);
        let c = rms(&kv[..m.latent], &w.kv_a_norm, d.latent_eps);
        cache.latent.extend(c.iter().chain(&kv[m.latent..]).map(|&v| bf(v) as f32));
        let pos = cache.len;
        cache.len += 1;
        let sel: Vec<usize> = match (&d.indexer, &w.indexer) {
            (Some((ih, id, k, eps)), Some(iw)) => {
                let kk = layer_norm(&linear(&iw.wk, &xt), &iw.k_norm_w, &iw.k_norm_b, *eps);
                cache.keys.extend(kk.iter().map(|&v| bf(v) as f32));
                let prec = |v: &f64| if d.index_bf16 { bf(*v as f32 as f64) as f32 } else { *v as f32 };
                let qi: Vec<f32> = linear(&iw.wq_b, &cq).iter().map(prec).collect();
                let wt: Vec<f32> = linear(&iw.weights_proj, &xt).iter().map(prec).collect();
                let s = index_scores(&qi, &wt, &cache.keys, *ih, *id, 1, pos, pos + 1);
                let sel = topk(&s, pos + 1, *k);
                traces.push(TokenTrace { scores: sel.iter().map(|&i| s[i]).collect(), selected: sel.clone() });
                sel
            }
            _ => (0..=pos).collect(),
        };
        let qf: Vec<f32> = q.iter().map(|&v| v as f32).collect();
        let (mut o, _) = sparse_mla_absorbed(&m, &qf, &cache.latent[..cache.len * width], &w.kv_b, &sel);
        if let Some(g) = &w.g_proj {
            for (v, gl) in o.iter_mut().zip(linear(g, &xt)) {
                *v /= 1.0 + (-gl).exp();
            }
        }
        out.extend(linear(&w.o_proj, &o));
    }
    (out, traces)
}
