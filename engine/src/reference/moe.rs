//! CPU reference of the MoE ops (spec 2.4, 6): router selection, gated activations, one
//! expert MLP, and the whole LatentMoE + shared-expert FFN. f64 accumulation.

use crate::config::{Activation, RouterConfig};

fn sigmoid(v: f64) -> f64 {
    1.0 / (1.0 + (-v).exp())
}

/// act(gate, up) of spec 2.4 (SiTU) or SiLU-GLU.
pub fn glu(act: Activation, g: f64, u: f64) -> f64 {
    match act {
        Activation::Silu => g * sigmoid(g) * u,
        Activation::Situ { beta, linear_beta } => {
            let (b, up) = (beta as f64, linear_beta.map_or(u, |lb| lb as f64 * (u / lb as f64).tanh()));
            b * (g / b).tanh() * sigmoid(g) * up
        }
    }
}

/// Router selection for one token: (idx in rank order, weights) from logits [experts].
pub fn route(cfg: &RouterConfig, logits: &[f32], bias: &[f32], top_k: usize) -> (Vec<u32>, Vec<f32>) {
    let n = logits.len();
    let s: Vec<f64> = logits.iter().map(|&l| sigmoid(l as f64)).collect();
    let mut key: Vec<f64> = s.iter().zip(bias).map(|(&a, &b)| (a as f32 + b) as f64).collect();
    let groups = cfg.num_expert_group.max(1);
    if groups > 1 && cfg.topk_group < groups {
        let per = n / groups;
        let gs: Vec<f64> = (0..groups)
            .map(|g| {
                let mut v: Vec<f64> = key[g * per..(g + 1) * per].to_vec();
                v.sort_by(|a, b| b.total_cmp(a));
                v.iter().take(2).sum()
            })
            .collect();
        let mut order: Vec<usize> = (0..groups).collect();
        order.sort_by(|&a, &b| gs[b].total_cmp(&gs[a]).then(a.cmp(&b)));
        for &g in &order[cfg.topk_group..] {
            key[g * per..(g + 1) * per].iter_mut().for_each(|k| *k = f64::NEG_INFINITY);
        }
    }
    let mut order: Vec<usize> = (0..n).collect();
    order.sort_by(|&a, &b| key[b].total_cmp(&key[a]).then(a.cmp(&b)));
    let idx: Vec<u32> = order[..top_k].iter().map(|&i| i as u32).collect();
    let sum: f64 = idx.iter().map(|&i| s[i as usize]).sum();
    let norm = if cfg.renormalize && top_k > 1 { 1.0 / (sum + 1e-20) } else { 1.0 };
    let wts = idx.iter().map(|&i| (s[i as usize] * norm * cfg.routed_scaling_factor as f64) as f32).collect();
    (idx, wts)
}

/// `y = W x`, W [rows, cols] row-major, f64 accumulation.
pub fn matvec(w: &[f32], rows: usize, cols: usize, x: &[f32]) -> Vec<f64> {
    (0..rows).map(|r| w[r * cols..(r + 1) * cols].iter().zip(x).map(|(&a, &b)| a as f64 * b as f64).sum()).collect()
}

/// One gated MLP: w2 act(w1 x, w3 x); w1, w3 [mid, n], w2 [n_out, mid].
#[allow(clippy::too_many_arguments)]
pub fn mlp(act: Activation, w1: &[f32], w3: &[f32], w2: &[f32], n: usize, mid: usize, n_out: usize, x: &[f32]) -> Vec<f64> {
    let g = matvec(w1, mid, n, x);
    let u = matvec(w3, mid, n, x);
    let h: Vec<f32> = g.iter().zip(&u).map(|(&a, &b)| glu(act, a, b) as f32).collect();
    matvec(w2, n_out, mid, &h)
}

/// Dense expert weights (dequantised) of one layer: w1, w3 [n_mid, n_in], w2 [n_in, n_mid].
pub struct DenseExpert {
    pub w1: Vec<f32>,
    pub w3: Vec<f32>,
    pub w2: Vec<f32>,
}

/// Weighted sum of the selected experts for one token: sum_j wts[j] expert_{idx[j]}(z).
pub fn experts(act: Activation, ex: &[DenseExpert], n_in: usize, n_mid: usize, idx: &[u32], wts: &[f32], z: &[f32]) -> Vec<f32> {
    let mut acc = vec![0f64; n_in];
    for (&e, &w) in idx.iter().zip(wts) {
        let d = &ex[e as usize];
        let y = mlp(act, &d.w1, &d.w3, &d.w2, n_in, n_mid, n_in, z);
        acc.iter_mut().zip(&y).for_each(|(a, &b)| *a += w as f64 * b);
    }
    acc.iter().map(|&v| v as f32).collect()
}
