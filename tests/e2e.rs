//! The whole model against logits produced by the independent references (tools/reference,
//! checked against fla, transformers and the public K3 code): full and incremental runs,
//! greedy continuations, and snapshot/restore of a session.

mod support;

use k31_engine::checkpoint::Checkpoint;
use k31_engine::model::{Hooks, LogitsFor, Model};
use k31_engine::session::Snapshot;
use support::golden::{self, golden_dir};

/// Context the golden models are loaded with (k31_long's 260 tokens and its greedy steps fit).
const CONTEXT: usize = 512;

fn load(dir: &str) -> Option<Model> {
    let g = support::gpu()?;
    let ck = Checkpoint::open(&golden_dir().join(dir)).expect("golden checkpoint validates");
    Some(Model::load(g, &ck, CONTEXT, &k31_engine::layers::load_ffn, |_, _| {}).expect("model loads"))
}

fn rel_l2(got: &[f32], want: &[f32]) -> f64 {
    assert_eq!(got.len(), want.len());
    let num: f64 = got.iter().zip(want).map(|(a, b)| (*a as f64 - *b as f64).powi(2)).sum();
    let den: f64 = want.iter().map(|b| (*b as f64).powi(2)).sum();
    (num / den).sqrt()
}

fn ids_of(file: &str) -> Vec<u32> {
    golden::load_int_tensors(file)["input_ids"].1.iter().map(|&v| v as u32).collect()
}

/// Prints `got`'s distance to `want` and, with a bound, asserts it.
fn expect_close(dir: &str, what: &str, got: &[f32], want: &[f32], bound: Option<f64>) {
    let e = rel_l2(got, want);
    eprintln!("{dir}: {what} logits rel L2 {e:.2e}");
    if let Some(b) = bound {
        assert!(e <= b, "{dir}: {what} logits rel L2 {e} (bound {b:e})");
    }
}

fn argmax(row: &[f32]) -> u32 {
    k31_engine::sample::argmax(row).expect("finite logits")
}

/// The whole model in f32 against the f64 reference that stores its caches as the engine does:
/// the reference in f32 is 3e-6 from it on k31_tiny (tests/golden/README.md) and the engine on
/// lavapipe 7e-6 / 1.1e-5; the margin is for adapters whose kernels round differently (the
/// tensor-core GEMMs, ~8e-7 per op). A 3e-5 change in one activation reads 2.3e-4 here. Models
/// that amplify rounding more say so in their outputs.json (`rel_l2_f32_reference_vs_f64_bf16_caches`,
/// what the reference itself moves in f32): they get four times that.
const BF16_CACHE_TOLERANCE: f64 = 1e-4;

/// Full forward, prefill-then-decode, and greedy continuation against one golden file.
/// `unrounded`: the tolerance against logits whose reference kept its caches unrounded (None
/// where the bf16 caches flip sparse selections there, as in k31_awkward: 1.5e-2 apart).
fn check_model(dir: &str, outputs: &str, split: usize, greedy_steps: usize, unrounded: Option<f64>) {
    let Some(model) = load(&format!("{dir}/model")) else { return };
    let file = format!("{dir}/{outputs}");
    let mut want = golden::load_tensors(&file);
    // Kimi Linear's logits come from transformers; the reference's with bf16 caches sit beside them.
    let extra = golden_dir().join(dir).join("k31ref_bf16_caches.safetensors");
    if extra.exists() {
        want.extend(golden::load_tensors(&extra));
    }
    let meta = golden_dir().join(dir).join("outputs.json");
    let f32_reference = if meta.exists() { golden::load_json(&meta)["rel_l2_f32_reference_vs_f64_bf16_caches"].as_f64() } else { None };
    let bf16_tolerance = f32_reference.map_or(BF16_CACHE_TOLERANCE, |r| BF16_CACHE_TOLERANCE.max(4.0 * r));
    let ids = ids_of(&file);
    let vocab = model.config.vocab_size;

    let mut s = model.new_session().expect("session");
    let full = model.forward(&mut s, &ids, LogitsFor::All, &mut Hooks::default()).expect("full forward").logits;
    // k31_tiny sits at 9.8e-4 here: the engine stores its caches in bf16 (spec 5.5), the f64
    // reference of these logits does not; against the same reference storing them in bf16
    // (the `_bf16_caches` logits) it agrees to f32 rounding.
    expect_close(dir, "full", &full, &golden::get(&want, "logits_full").1, unrounded);
    let bf16 = |name: &str| want.get(name).map(|(_, v)| v.as_slice());
    let with_bf16 = Some(bf16_tolerance);
    if let Some(w) = bf16("logits_full_bf16_caches") {
        expect_close(dir, "full (reference with bf16 caches)", &full, w, with_bf16);
    }

    let mut s = model.new_session().expect("session");
    let mut inc = model.forward(&mut s, &ids[..split], LogitsFor::All, &mut Hooks::default()).expect("prefill").logits;
    for &id in &ids[split..] {
        inc.extend(model.forward(&mut s, &[id], LogitsFor::Last, &mut Hooks::default()).expect("decode").logits);
    }
    expect_close(dir, "incremental", &inc, &golden::get(&want, "logits_incremental").1, unrounded);
    if let Some(w) = bf16("logits_incremental_bf16_caches") {
        expect_close(dir, "incremental (reference with bf16 caches)", &inc, w, with_bf16);
    }

    // The prompt as two prefill chunks (the second attends to the first one's caches and state,
    // as long prompts run), against the full run's logits.
    if let Some(w) = bf16("logits_full_bf16_caches") {
        let mut s = model.new_session().expect("session");
        let mut two = model.forward(&mut s, &ids[..split], LogitsFor::All, &mut Hooks::default()).expect("first chunk").logits;
        two.extend(model.forward(&mut s, &ids[split..], LogitsFor::All, &mut Hooks::default()).expect("second chunk").logits);
        expect_close(dir, "two-chunk prefill (reference with bf16 caches)", &two, w, with_bf16);
    }

    // Every token alone from an empty cache (decode kernels at every position, the dense rows
    // below index_topk included), where the golden has it.
    if let Some(w) = bf16("logits_decode_only_bf16_caches") {
        let mut s = model.new_session().expect("session");
        let mut dec = Vec::new();
        for &id in &ids {
            dec.extend(model.forward(&mut s, &[id], LogitsFor::Last, &mut Hooks::default()).expect("decode").logits);
        }
        expect_close(dir, "decode-only (reference with bf16 caches)", &dec, w, with_bf16);
    }

    // Greedy: continue after the whole sequence.
    let want_tokens: Vec<u32> = golden::load_int_tensors(&file)["greedy_tokens"].1.iter().map(|&v| v as u32).collect();
    let mut last = full[(ids.len() - 1) * vocab..].to_vec();
    let mut s2 = s; // holds the incremental run: same tokens as the full one
    let mut got = Vec::new();
    for _ in 0..greedy_steps.min(want_tokens.len()) {
        let next = argmax(&last);
        got.push(next);
        last = model.forward(&mut s2, &[next], LogitsFor::Last, &mut Hooks::default()).expect("greedy step").logits;
    }
    assert_eq!(got, want_tokens[..got.len()], "{dir}: greedy continuation");
}

#[test]
fn k31_tiny_matches_the_reference() {
    check_model("k31_tiny", "outputs.safetensors", 20, 16, Some(1e-3));
}

/// Other shapes than k31_tiny (tests/golden/README.md): KDA heads of 64, MLA 3 heads with a
/// 96-wide latent and values of 24, an indexer picking 8 of 100 positions, AttnRes blocks of 2,
/// group-limited routing (top-3 of 12 experts in 3 groups, 2 kept), a prefill crossing a
/// 64-token chunk.
#[test]
fn k31_awkward_matches_the_reference() {
    check_model("k31_awkward", "outputs.safetensors", 70, 8, None);
}

/// k31_awkward's shapes over 260 tokens: a prefill of 200 (three KDA chunks and a ragged one),
/// the indexer picking 8 of up to 260 positions, 60 decode steps after it.
#[test]
fn k31_long_matches_the_reference() {
    check_model("k31_long", "outputs.safetensors", 200, 8, None);
}

/// The K3.1 layout with options k31_tiny uses turned off or swapped: AttnRes blocks of one layer,
/// the KDA low-rank output gate (4 heads of 32), MLA without its output gate, no shared experts,
/// two dense layers; a prefill of exactly one 64-token chunk. It amplifies rounding ~40x more
/// than k31_tiny (its f32 reference is 1.3e-4 from the f64 one), hence its wider tolerance.
#[test]
fn k31_plain_matches_the_reference() {
    check_model("k31_plain", "outputs.safetensors", 64, 8, None);
}

#[test]
fn kimi_linear_matches_transformers() {
    check_model("kimi_linear_tiny", "hf_outputs.safetensors", 13, 12, Some(1e-3));
}

/// transformers' Kimi Linear at other shapes (KDA 3 heads x 64, MLA 3 heads with kv_lora 32 and
/// v 16, routing in 2 groups with 1 kept, two full-attention layers, 70 tokens); against
/// transformers' fp32-cache logits the bf16 cache alone is 1.06e-3, hence 2e-3 there.
#[test]
fn kimi_linear_awkward_matches_transformers() {
    check_model("kimi_linear_awkward", "hf_outputs.safetensors", 45, 8, Some(2e-3));
}

#[test]
fn snapshot_restore_continues_identically() {
    let Some(model) = load("k31_tiny/model") else { return };
    let gpu = model.gpu.clone();
    let ids = ids_of("k31_tiny/outputs.safetensors");
    let (prefix, rest) = ids.split_at(24);
    let mut s = model.new_session().expect("session");
    model.forward(&mut s, prefix, LogitsFor::Last, &mut Hooks::default()).expect("prefix");
    let snap = s.snapshot(&gpu).expect("snapshot");
    let path = support::scratch("e2e-snapshot").join("prefix.k31session");
    snap.save(&path).expect("save");

    let run = |s: &mut k31_engine::session::Session| -> Vec<f32> {
        let mut out = Vec::new();
        for &id in &rest[..6] {
            out.extend(model.forward(s, &[id], LogitsFor::Last, &mut Hooks::default()).expect("decode").logits);
        }
        out
    };
    let uninterrupted = run(&mut s);
    // Restore into a used session, and into a fresh one from disk.
    model.forward(&mut s, &rest[6..9], LogitsFor::Last, &mut Hooks::default()).expect("more");
    s.restore(&gpu, &snap).expect("restore");
    assert_eq!(s.position, 24);
    let restored = run(&mut s);
    let mut fresh = model.new_session().expect("session");
    let loaded = Snapshot::load(&path).expect("load");
    assert_eq!(loaded, snap, "disk round trip");
    fresh.restore(&gpu, &loaded).expect("restore from disk");
    let from_disk = run(&mut fresh);
    // The streaming save (one buffer at a time, straight from the GPU) writes the same file
    // content, and the streaming restore (straight from the mapping) continues identically.
    let streamed = path.with_file_name("streamed.k31session");
    s.restore(&gpu, &snap).expect("restore");
    s.save(&gpu, &streamed).expect("streaming save");
    assert_eq!(Snapshot::load(&streamed).expect("load streamed"), snap, "streamed file");
    assert_eq!(k31_engine::session::snapshot_tokens(&streamed).expect("tokens"), prefix);
    let mut fresh2 = model.new_session().expect("session");
    fresh2.restore_file(&gpu, &streamed).expect("restore_file");
    let from_file = run(&mut fresh2);
    for (name, got) in [("restored", &restored), ("from disk", &from_disk), ("streamed", &from_file)] {
        let max = got.iter().zip(&uninterrupted).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
        assert!(max <= 1e-6, "{name}: logits differ by {max}");
    }
    // A snapshot that does not fit (its 24 positions past a 16-position context) is refused
    // before any layer is written: the session continues as if nothing happened.
    let mut small = k31_engine::session::Session::new(&gpu, &model.config, 16).expect("small session");
    let e = small.restore_file(&gpu, &streamed).expect_err("too long for the context");
    assert!(e.to_string().contains("context"), "{e}");
    assert!(small.restore(&gpu, &snap).is_err());
    assert_eq!(small.position, 0);
    let mut clean = k31_engine::session::Session::new(&gpu, &model.config, 16).expect("clean session");
    let after_refusal = model.forward(&mut small, &rest[..1], LogitsFor::Last, &mut Hooks::default()).expect("after refusal").logits;
    let untouched = model.forward(&mut clean, &rest[..1], LogitsFor::Last, &mut Hooks::default()).expect("clean").logits;
    assert_eq!(after_refusal, untouched, "a refused restore changed the session");
    // A snapshot file that is not one, a truncated one or an empty one is a clear error.
    let whole = std::fs::read(&path).expect("read");
    std::fs::write(&path, &whole[..whole.len() / 2]).expect("write");
    let e = Snapshot::load(&path).expect_err("truncated");
    assert!(e.to_string().contains(&path.display().to_string()), "{e}");
    for junk in [&b"nonsense"[..], &b""[..]] {
        std::fs::write(&path, junk).expect("write");
        assert!(Snapshot::load(&path).is_err());
    }
    let e = Snapshot::load(path.parent().expect("dir")).expect_err("a directory");
    assert!(e.to_string().contains("directory"), "{e}");
}

#[test]
fn bad_inputs_are_errors() {
    let Some(model) = load("k31_tiny/model") else { return };
    let mut s = model.new_session().expect("session");
    let e = model.forward(&mut s, &[], LogitsFor::Last, &mut Hooks::default()).err().expect("empty").to_string();
    assert!(e.contains("empty"), "{e}");
    let e = model.forward(&mut s, &[5, 512], LogitsFor::Last, &mut Hooks::default()).err().expect("id").to_string();
    assert!(e.contains("512") && e.contains("vocabulary"), "{e}");
    let long = vec![1u32; CONTEXT + 1];
    let e = model.forward(&mut s, &long, LogitsFor::Last, &mut Hooks::default()).err().expect("long").to_string();
    assert!(e.contains("context"), "{e}");
    assert_eq!(s.position, 0, "failed calls leave the session untouched");
}
