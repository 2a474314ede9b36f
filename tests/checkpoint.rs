//! Checkpoint loading and validation: `k31 init` output and independently written
//! checkpoints load; every kind of damage is reported, all problems in one error.

mod support;

use k31_engine::checkpoint::{Checkpoint, CheckpointError};
use k31_engine::init::{preset_config, write_checkpoint, PresetOptions};
use safetensors::{Dtype, SafeTensors};
use std::path::{Path, PathBuf};
use support::scratch;

/// A tiny checkpoint written once per test binary; tests copy it before damaging it.
fn tiny() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| {
        let d = scratch("ck-tiny").join("model");
        let cfg = preset_config("tiny", &PresetOptions::default()).expect("preset");
        write_checkpoint(&d, &cfg, 3, |_, _| {}).expect("init tiny");
        d
    })
    .clone()
}

type Owned = Vec<(String, Dtype, Vec<usize>, Vec<u8>)>;

fn read_all(file: &Path) -> Owned {
    let bytes = std::fs::read(file).expect("read");
    let st = SafeTensors::deserialize(&bytes).expect("valid file");
    let mut v: Owned =
        st.tensors().into_iter().map(|(n, t)| (n, t.dtype(), t.shape().to_vec(), t.data().to_vec())).collect();
    v.sort_by(|a, b| a.0.cmp(&b.0));
    v
}

fn write_all(file: &Path, tensors: &Owned) {
    let views: Vec<(String, safetensors::tensor::TensorView)> = tensors
        .iter()
        .map(|(n, d, s, b)| (n.clone(), safetensors::tensor::TensorView::new(*d, s.clone(), b).expect("view")))
        .collect();
    safetensors::serialize_to_file(views, None, file).expect("write");
}

/// Copies the model in `src` into a fresh directory, passing its config through `edit`
/// and its tensors through `damage`.
fn rewritten(
    src: &Path,
    name: &str,
    edit: impl FnOnce(&mut serde_json::Value),
    damage: impl FnOnce(&mut Owned),
) -> PathBuf {
    let dir = scratch(name);
    let mut cfg: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(src.join("config.json")).expect("config")).expect("JSON");
    edit(&mut cfg);
    std::fs::write(dir.join("config.json"), cfg.to_string()).expect("write config");
    let mut t = read_all(&src.join("model.safetensors"));
    damage(&mut t);
    write_all(&dir.join("model.safetensors"), &t);
    dir
}

/// The tiny model with its tensors passed through `damage`.
fn damaged(name: &str, damage: impl FnOnce(&mut Owned)) -> PathBuf {
    rewritten(&tiny(), name, |_| {}, damage)
}

fn problems(dir: &Path) -> String {
    match Checkpoint::open(dir) {
        Ok(_) => panic!("{} should not validate", dir.display()),
        Err(e) => e.to_string(),
    }
}

#[test]
fn init_output_loads_back_and_is_deterministic() {
    let ck = Checkpoint::open(&tiny()).expect("tiny validates");
    assert_eq!(ck.config.num_layers(), 8);
    let emb = ck.tensor("model.embed_tokens.weight").expect("embedding");
    assert_eq!(emb.shape, &[4096, 256]);
    let packed = ck.tensor("model.layers.1.block_sparse_moe.experts.3.w2.weight_packed").expect("MXFP4 plane");
    assert_eq!(packed.shape, &[128, 32]);
    // Same seed, same bytes; another seed, other bytes.
    let cfg = preset_config("tiny", &PresetOptions::default()).expect("preset");
    let again = scratch("ck-tiny-again").join("m");
    write_checkpoint(&again, &cfg, 3, |_, _| {}).expect("init");
    let a = std::fs::read(tiny().join("model.safetensors")).expect("read");
    assert_eq!(a, std::fs::read(again.join("model.safetensors")).expect("read"));
    let other = scratch("ck-tiny-other").join("m");
    write_checkpoint(&other, &cfg, 4, |_, _| {}).expect("init");
    assert_ne!(a, std::fs::read(other.join("model.safetensors")).expect("read"));
    // Refuses to overwrite a model.
    assert!(write_checkpoint(&again, &cfg, 3, |_, _| {}).is_err());
}

#[test]
fn independently_written_checkpoints_load() {
    let golden = support::golden::golden_dir();
    // Written by tools/reference (PyTorch) in the K3.1 layout with the language_model. prefix.
    let k31 = Checkpoint::open(&golden.join("k31_tiny/model")).expect("reference K3.1 tiny validates");
    assert!(k31.config.indexer.is_some());
    // Written by transformers' save_pretrained (Kimi Linear spelling).
    let kl = Checkpoint::open(&golden.join("kimi_linear_tiny/model")).expect("transformers Kimi Linear validates");
    assert!(kl.tensor("model.layers.0.mlp.gate_proj.weight").is_some(), "dense MLP found under its canonical name");
}

#[test]
fn missing_extra_misshaped_and_wrong_dtype_tensors_are_all_listed() {
    let dir = damaged("ck-damaged", |t| {
        t.retain(|(n, ..)| n != "language_model.model.layers.2.self_attn.q_proj.weight");
        t.push(("language_model.model.layers.2.self_attn.typo_proj.weight".into(), Dtype::BF16, vec![2, 2], vec![0; 8]));
        for (n, d, s, b) in t.iter_mut() {
            if n == "language_model.model.layers.2.self_attn.b_proj.weight" {
                *s = vec![s[1], s[0]];
            }
            if n == "language_model.model.layers.1.block_sparse_moe.experts.0.w1.weight_packed" {
                *d = Dtype::I8;
                let _ = b;
            }
            if n == "language_model.model.norm.weight" {
                *d = Dtype::I16;
            }
        }
    });
    let e = problems(&dir);
    for want in [
        "missing tensor `model.layers.2.self_attn.q_proj.weight`",
        "unexpected tensor `model.layers.2.self_attn.typo_proj.weight`",
        "`model.layers.2.self_attn.b_proj.weight` has shape [256, 2] but the config implies [2, 256]",
        "experts.0.w1.weight_packed` has dtype i8 but must be u8",
        "`model.norm.weight` has dtype i16 but must be bf16, f16 or f32",
        "5 problems",
    ] {
        assert!(e.contains(want), "missing `{want}` in:\n{e}");
    }
}

#[test]
fn transposed_projection_is_caught() {
    let dir = damaged("ck-shape", |t| {
        for (n, _, s, _) in t.iter_mut() {
            if n == "language_model.model.layers.3.self_attn.kv_b_proj.weight" {
                *s = vec![s[1], s[0]];
            }
        }
    });
    assert!(problems(&dir).contains("kv_b_proj.weight` has shape"));
}

#[test]
fn index_key_norm_bias_may_be_absent() {
    // Spec Q2: without `k_norm.bias` the LayerNorm has no shift.
    let dir = damaged("ck-nobias", |t| t.retain(|(n, ..)| !n.ends_with("indexer.k_norm.bias")));
    Checkpoint::open(&dir).expect("a checkpoint without k_norm.bias validates");
}

#[test]
fn a_dsa_config_without_indexer_weights_is_refused() {
    let dir = damaged("ck-noindexer", |t| t.retain(|(n, ..)| !n.contains(".indexer.")));
    let e = problems(&dir);
    assert!(e.contains("sparse attention") && e.contains("will not silently run dense attention"), "{e}");
}

#[test]
fn truncated_and_garbage_files_are_clear_errors() {
    let dir = scratch("ck-trunc");
    std::fs::copy(tiny().join("config.json"), dir.join("config.json")).expect("copy");
    let bytes = std::fs::read(tiny().join("model.safetensors")).expect("read");
    std::fs::write(dir.join("model.safetensors"), &bytes[..bytes.len() - 1000]).expect("write");
    let e = Checkpoint::open(&dir).err().expect("truncated");
    assert!(matches!(e, CheckpointError::Corrupt { .. }), "{e}");
    assert!(e.to_string().contains("truncated"), "{e}");
    std::fs::write(dir.join("model.safetensors"), b"garbage").expect("write");
    assert!(matches!(Checkpoint::open(&dir), Err(CheckpointError::Corrupt { .. })));
    std::fs::remove_file(dir.join("model.safetensors")).expect("rm");
    assert!(matches!(Checkpoint::open(&dir), Err(CheckpointError::NoWeights { .. })));
}

#[test]
fn sharded_checkpoints_load_and_bad_indexes_are_errors() {
    let dir = scratch("ck-sharded");
    std::fs::copy(tiny().join("config.json"), dir.join("config.json")).expect("copy");
    let all = read_all(&tiny().join("model.safetensors"));
    let mut map = serde_json::Map::new();
    for (i, part) in all.chunks(all.len().div_ceil(3)).enumerate() {
        let file = format!("model-{:05}-of-00003.safetensors", i + 1);
        write_all(&dir.join(&file), &part.to_vec());
        for (n, ..) in part {
            map.insert(n.clone(), serde_json::json!(file));
        }
    }
    let index = serde_json::json!({"metadata": {}, "weight_map": map});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).expect("index");
    let ck = Checkpoint::open(&dir).expect("sharded validates");
    assert_eq!(ck.shard_paths().count(), 3);
    let one = Checkpoint::open(&tiny()).expect("single");
    let name = "model.layers.7.self_attn.indexer.wk.weight";
    assert_eq!(ck.tensor(name).expect("t").data, one.tensor(name).expect("t").data);

    std::fs::remove_file(dir.join("model-00002-of-00003.safetensors")).expect("rm");
    let e = Checkpoint::open(&dir).err().expect("missing shard").to_string();
    assert!(e.contains("model-00002-of-00003.safetensors"), "{e}");
    std::fs::write(dir.join("model.safetensors.index.json"), "{\"weight_map\": 3}").expect("index");
    assert!(matches!(Checkpoint::open(&dir), Err(CheckpointError::BadIndex { .. })));
}

#[test]
fn names_without_the_wrapper_prefix_load_too() {
    let dir = damaged("ck-noprefix", |t| {
        for (n, ..) in t.iter_mut() {
            *n = n.trim_start_matches("language_model.").to_string();
        }
    });
    Checkpoint::open(&dir).expect("unprefixed names validate");
    let dup = damaged("ck-dup", |t| {
        let (n, d, s, b) = t[0].clone();
        t.push((n.trim_start_matches("language_model.").to_string(), d, s, b));
    });
    assert!(problems(&dup).contains("appears twice"));
}

#[test]
fn missing_config_is_a_clear_error() {
    let dir = scratch("ck-noconfig");
    let e = Checkpoint::open(&dir).err().expect("no config").to_string();
    assert!(e.contains("config.json"), "{e}");
}

#[test]
fn kimi_linear_spellings_in_the_wild() {
    let src = support::golden::golden_dir().join("kimi_linear_tiny/model");
    // Moonshot's spelling: the dense layer's MLP under mlp.*_proj.
    let moonshot = rewritten(&src, "ck-kl-moonshot", |_| {}, |t| {
        for (n, ..) in t.iter_mut() {
            if n.starts_with("model.layers.0.block_sparse_moe.") {
                *n = n.replace("block_sparse_moe", "mlp");
            }
        }
    });
    Checkpoint::open(&moonshot).expect("Moonshot spelling validates");
    let no_shared = |cfg: &mut serde_json::Value| {
        cfg["num_shared_experts"] = serde_json::json!(0);
    };
    // No shared experts: Moonshot omits the tensors, transformers writes zero-sized ones.
    let absent = rewritten(&src, "ck-kl-noshared", no_shared, |t| t.retain(|(n, ..)| !n.contains("shared_experts")));
    Checkpoint::open(&absent).expect("absent shared experts validate");
    let zero = rewritten(&src, "ck-kl-zeroshared", no_shared, |t| {
        for (n, _, s, b) in t.iter_mut() {
            if n.contains("shared_experts") {
                s[0] = 0;
                b.clear();
            }
        }
    });
    Checkpoint::open(&zero).expect("zero-sized shared experts validate");
    // But real shared-expert weights with a config that has none would be silently dropped.
    let e = problems(&rewritten(&src, "ck-kl-extra", no_shared, |_| {}));
    assert!(e.contains("unexpected tensor `model.layers.1.block_sparse_moe.shared_experts"), "{e}");
}
