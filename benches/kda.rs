//! KDA kernels at one K3.1 layer's shape (96 heads x 128), next to ceilings measured in the same run:
//! * decode: the fused one-token kernel per layer, over 16 distinct layer states (96 MiB, more
//!   than the 60 MB L2) so the state really streams from memory; rate = state read + write
//!   bytes against the copy bandwidth;
//! * prefill: the chunked WY/UT path (prep + cumsum + intra + scan) at T = 8192, with a
//!   per-kernel breakdown and its FLOP rate;
//! * the same 8192 tokens token by token through the decode kernel (wall clock of one
//!   submission), for the >= 20x comparison.
//! Run: `cargo bench --bench kda -- [--quick] [--json FILE]`.

use k31_engine::bench::{copy_bandwidth, time_gpu, Row};
use k31_engine::config::KdaGate;
use k31_engine::gpu::{Gpu, Profiler};
use k31_engine::ops::kda::{self, ChunkScratch, KdaGeom, KdaInputs, Prepped};

fn main() -> anyhow::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let json_out = args.iter().position(|a| a == "--json").and_then(|i| args.get(i + 1)).cloned();
    let quick = args.iter().any(|a| a == "--quick");
    let gpu = Gpu::open(None)?;
    println!("GPU: {}", gpu.describe());
    let copy = copy_bandwidth(&gpu, if quick { 64 << 20 } else { 1 << 30 })? / 1e9;
    println!("copy bandwidth (read+write): {copy:.1} GB/s");
    let (heads, dk, t_len, layers) = if quick { (4, 128, 512, 2) } else { (96, 128, 8192, 16) };
    let geom = KdaGeom { heads, head_dim: dk, taps: 4, gate: KdaGate::Bounded { lower_bound: -5.0 }, post_conv: false };
    let p = geom.proj();
    let rnd = |n: usize, s: f32| -> Vec<f32> { (0..n).map(|i| (((i * 7919) % 1013) as f32 / 1013.0 - 0.5) * s).collect() };
    let qkv = gpu.storage_from("qkv", &rnd(t_len * 3 * p, 2.0));
    let f = gpu.storage_from("f", &rnd(t_len * p, 2.0));
    let b = gpu.storage_from("b", &rnd(t_len * heads, 4.0));
    let conv_w = gpu.storage_from("conv", &rnd(3 * p * 4, 1.0));
    let a_log = gpu.storage_from("a_log", &vec![1.0f32; heads]);
    let dt_bias = gpu.storage_from("dt", &rnd(p, 1.0));
    let inp = KdaInputs { qkv: &qkv, f: &f, b: &b, conv_w: &conv_w, a_log: &a_log, dt_bias: &dt_bias };
    let ring = gpu.storage("ring", (4 * 3 * p * 4) as u64);
    let state_bytes = heads * dk * dk * 4;
    let mut rows = Vec::new();
    let mut extra = serde_json::Map::new();

    // Decode: one token per layer, `layers` distinct states.
    let states: Vec<_> = (0..layers).map(|_| gpu.storage_from("state", &rnd(heads * dk * dk, 0.1))).collect();
    let o = gpu.storage("o", (p * 4) as u64);
    let t = time_gpu(&gpu, 3, 20, |enc, mut prof| {
        for s in &states {
            kda::decode(&gpu, enc, &geom, 100, &inp, &ring, s, &o, prof.as_deref_mut())?;
        }
        Ok(())
    })? / layers as f64;
    let row = Row {
        name: format!("kda decode 1 token {heads}x{dk} (per layer)"),
        time_us: t * 1e6,
        rate: 2.0 * state_bytes as f64 / t / 1e9,
        ceiling: copy,
        unit: "GB/s",
    };
    row.print();
    rows.push(row);

    // Chunked prefill.
    let pre = Prepped::new(&gpu, &geom, t_len);
    let scratch = ChunkScratch::new(&gpu, &geom, t_len)?;
    let state = gpu.storage("state", state_bytes as u64);
    let ot = gpu.storage("o", (t_len * p * 4) as u64);
    let mut record = |enc: &mut _, mut prof: Option<&mut Profiler>| -> Result<(), k31_engine::gpu::GpuError> {
        kda::prep(&gpu, enc, &geom, t_len, 0, &inp, &ring, &pre, prof.as_deref_mut())?;
        kda::chunk_prefill(&gpu, enc, &geom, &pre, &scratch, &state, &ot, prof)
    };
    let t_pre = time_gpu(&gpu, 2, 10, &mut record)?;
    // Useful FLOPs of the chunked form per (chunk, head): A_kk + A_qk (2 C^2 K), UT solve on
    // K + V columns (C^2 (K+V)/2 x 2), U = u - wS, qg S, kg^T U (3 x 2 C K V), A_qk U (C^2 V).
    let (c, kf) = (64.0, dk as f64);
    let per = 2.0 * c * c * kf * 2.0 + c * c * 2.0 * kf + 3.0 * 2.0 * c * kf * kf + c * c * kf;
    let flops = per * (t_len as f64 / 64.0).ceil() * heads as f64;
    let row = Row {
        name: format!("kda chunked prefill T={t_len} {heads}x{dk}"),
        time_us: t_pre * 1e6,
        rate: flops / t_pre / 1e12,
        ceiling: f64::NAN,
        unit: "TFLOP/s",
    };
    println!("{:<48} {:>10.2} us  {:>9.2} TFLOP/s  ({:.1} M tokens/s)", row.name, row.time_us, row.rate, t_len as f64 / t_pre / 1e6);
    rows.push(row);
    let mut prof = Profiler::new(&gpu, 64);
    if prof.enabled() {
        let mut enc = gpu.device.create_command_encoder(&Default::default());
        record(&mut enc, Some(&mut prof))?;
        gpu.queue.submit([enc.finish()]);
        prof.collect(&gpu)?;
        for op in prof.report() {
            println!("    {:<24} {:>10.1} us", op.label, op.total_ns / 1e3);
            extra.insert(format!("prefill_{}_us", op.label), (op.total_ns / 1e3).into());
        }
    }

    // Token by token through the decode kernel: one submission of T dispatches.
    let mut enc = gpu.device.create_command_encoder(&Default::default());
    for pos in 0..t_len {
        kda::decode(&gpu, &mut enc, &geom, pos as u64, &inp, &ring, &state, &o, None)?;
    }
    let cmd = enc.finish();
    gpu.wait()?;
    let start = std::time::Instant::now();
    gpu.queue.submit([cmd]);
    gpu.wait()?;
    let t_tok = start.elapsed().as_secs_f64();
    println!(
        "{:<48} {:>10.2} us  (chunked prefill is {:.1}x faster)",
        format!("kda token-by-token T={t_len} (wall clock)"),
        t_tok * 1e6,
        t_tok / t_pre
    );
    extra.insert("token_by_token_us".into(), (t_tok * 1e6).into());
    extra.insert("chunked_speedup".into(), (t_tok / t_pre).into());

    if let Some(path) = json_out {
        let mut j = serde_json::json!({"gpu": gpu.describe(), "copy_gbs": copy, "rows": rows});
        if let Some(m) = j.as_object_mut() {
            m.extend(extra);
        }
        std::fs::write(&path, serde_json::to_string_pretty(&j)?)?;
    }
    Ok(())
}
