//! Config normalisation: the K3.1 / K3 wrappers and both Kimi Linear spellings parse into
//! one description; every malformed or inconsistent config is an error naming its key.

use k31_engine::config::{
    Architecture, ConfigError, ExpertFormat, Ffn, KdaGate, KdaOutputGate, Mixer, ModelConfig,
};
use serde_json::{json, Value};

fn k31_json() -> Value {
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/models/configs/kimi-k3.1-pro.json");
    serde_json::from_str(&std::fs::read_to_string(path).expect("reading the K3.1 config")).expect("valid JSON")
}

/// Sets (or with `None` removes) a dotted key.
fn edit(v: &mut Value, key: &str, value: Option<Value>) {
    let mut parts: Vec<&str> = key.split('.').collect();
    let last = parts.pop().expect("non-empty key");
    let mut cur = v;
    for p in parts {
        cur = cur.get_mut(p).unwrap_or_else(|| panic!("no {p} in {key}"));
    }
    let obj = cur.as_object_mut().expect("object");
    match value {
        Some(x) => {
            obj.insert(last.into(), x);
        }
        None => {
            obj.remove(last);
        }
    }
}

fn edited(key: &str, value: Option<Value>) -> Value {
    let mut v = k31_json();
    edit(&mut v, key, value);
    v
}

fn err_of(v: &Value) -> String {
    match ModelConfig::from_json(v) {
        Ok(_) => panic!("expected an error"),
        Err(e) => e.to_string(),
    }
}

#[test]
fn full_k31_config() {
    let c = ModelConfig::from_json(&k31_json()).expect("K3.1 config parses");
    assert_eq!(c.architecture, Architecture::KimiK31);
    assert_eq!(c.num_layers(), 93);
    assert_eq!(c.count_mixer(Mixer::Kda), 69);
    assert_eq!(c.count_mixer(Mixer::Global), 24);
    let globals: Vec<usize> = (0..93).filter(|&l| c.layers[l].mixer == Mixer::Global).collect();
    let mut want: Vec<usize> = (1..=23).map(|i| 4 * i - 1).collect();
    want.push(92);
    assert_eq!(globals, want, "0-based global layers 3,7,...,91,92");
    assert_eq!(c.layers[0].ffn, Ffn::Dense);
    assert!(c.layers[1..].iter().all(|l| l.ffn == Ffn::Moe));
    assert_eq!(c.global_cache_bytes_per_token(), 33_792);
    assert_eq!(c.kda_state_bytes().recurrent, 69 * 96 * 128 * 128 * 4);
    let ix = c.indexer.as_ref().expect("DSA indexer");
    assert_eq!((ix.n_heads, ix.head_dim, ix.topk), (32, 128, 2048));
    let kda = c.kda.as_ref().expect("KDA");
    assert_eq!(kda.gate, KdaGate::Bounded { lower_bound: -5.0 });
    assert_eq!(kda.output_gate, KdaOutputGate::FullRank);
    let moe = c.moe.as_ref().expect("MoE");
    assert_eq!((moe.num_experts, moe.experts_per_token, moe.num_shared_experts), (896, 16, 2));
    assert_eq!(moe.latent_size, Some(3584));
    assert_eq!(moe.expert_format, ExpertFormat::Mxfp4);
    let mla = c.mla.as_ref().expect("MLA");
    assert!(mla.output_gate);
    assert!((mla.softmax_scale() - 192f32.powf(-0.5)).abs() < 1e-9);
    assert_eq!(c.attn_res_block_size, Some(12));
    assert_eq!((c.bos_token_id, c.eos_token_id), (Some(163584), Some(163586)));
}

#[test]
fn k3_is_dense_global_attention() {
    let mut v = k31_json();
    edit(&mut v, "architectures", Some(json!(["KimiK3ForConditionalGeneration"])));
    for k in ["index_n_heads", "index_head_dim", "index_topk", "index_topk_freq", "index_rope_dim", "index_use_hadamard"] {
        edit(&mut v, &format!("text_config.{k}"), None);
    }
    let c = ModelConfig::from_json(&v).expect("K3 parses");
    assert_eq!(c.architecture, Architecture::KimiK3);
    assert!(c.indexer.is_none());
    assert_eq!(c.global_cache_bytes_per_token(), 24 * 576 * 2);
}

#[test]
fn k31_without_index_keys_is_an_error() {
    let e = err_of(&edited("text_config.index_topk", None));
    assert!(e.contains("text_config.index_topk"), "{e}");
}

/// Moonshot's original Kimi Linear config (flat, linear_attn_config, first_k_dense_replace).
fn moonshot_kimi_linear() -> Value {
    json!({
        "architectures": ["KimiLinearForCausalLM"], "model_type": "kimi_linear",
        "vocab_size": 512, "hidden_size": 64, "num_hidden_layers": 4, "rms_norm_eps": 1e-5,
        "hidden_act": "silu", "intermediate_size": 128, "first_k_dense_replace": 1, "moe_layer_freq": 1,
        "num_experts": 8, "num_experts_per_token": 2, "num_shared_experts": 1, "moe_intermediate_size": 32,
        "moe_renormalize": true, "routed_scaling_factor": 2.446, "num_expert_group": 1, "topk_group": 1,
        "num_attention_heads": 4, "num_key_value_heads": 4, "q_lora_rank": null, "kv_lora_rank": 64,
        "qk_nope_head_dim": 32, "qk_rope_head_dim": 16, "v_head_dim": 32, "mla_use_nope": true,
        "model_max_length": 1048576, "tie_word_embeddings": false,
        "linear_attn_config": {"num_heads": 2, "head_dim": 128, "short_conv_kernel_size": 4,
                               "kda_layers": [1, 2, 4], "full_attn_layers": [3]}
    })
}

#[test]
fn kimi_linear_both_spellings_agree() {
    let moonshot = ModelConfig::from_json(&moonshot_kimi_linear()).expect("Moonshot Kimi Linear parses");
    assert_eq!(moonshot.architecture, Architecture::KimiLinear);
    let kda = moonshot.kda.as_ref().expect("KDA");
    assert_eq!(kda.gate, KdaGate::Softplus);
    assert_eq!(kda.output_gate, KdaOutputGate::LowRank);
    assert!(!moonshot.mla.as_ref().expect("MLA").output_gate);
    assert_eq!(moonshot.moe.as_ref().expect("MoE").expert_format, ExpertFormat::Bf16);
    assert!(moonshot.attn_res_block_size.is_none());

    // transformers' save_pretrained spelling of the same model, as committed by the
    // reference tools.
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/golden/kimi_linear_tiny/model/config.json");
    let hf: Value = serde_json::from_str(&std::fs::read_to_string(path).expect("golden config")).expect("JSON");
    let hf = ModelConfig::from_json(&hf).expect("transformers Kimi Linear parses");
    assert_eq!(hf.layers, moonshot.layers);
    assert_eq!(hf.kda, moonshot.kda);
    assert_eq!(hf.mla, moonshot.mla);
    assert_eq!(hf.moe, moonshot.moe);
    assert_eq!(hf.activation, moonshot.activation);
    assert_eq!(hf.max_position_embeddings, moonshot.max_position_embeddings);
}

#[test]
fn every_config_error_names_its_key() {
    let cases: Vec<(Value, &str)> = vec![
        (edited("architectures", Some(json!(["LlamaForCausalLM"]))), "LlamaForCausalLM"),
        (edited("architectures", None), "architectures"),
        (edited("text_config", None), "text_config"),
        (edited("text_config.hidden_size", None), "text_config.hidden_size"),
        (edited("text_config.hidden_size", Some(json!("big"))), "text_config.hidden_size"),
        (edited("text_config.num_hidden_layers", Some(json!(0))), "text_config.num_hidden_layers"),
        (edited("text_config.linear_attn_config.kda_layers", Some(json!([1, 2, 3]))), "kda_layers"),
        (edited("text_config.linear_attn_config.full_attn_layers", Some(json!([4, 4]))), "full_attn_layers"),
        (edited("text_config.linear_attn_config.full_attn_layers", Some(json!([0, 4]))), "full_attn_layers[0]"),
        (edited("text_config.linear_attn_config.full_attn_layers", Some(json!([94]))), "full_attn_layers[0]"),
        (edited("text_config.linear_attn_config.head_dim", Some(json!(100))), "linear_attn_config.head_dim"),
        (edited("text_config.linear_attn_config.head_dim", Some(json!(512))), "linear_attn_config.head_dim"),
        (edited("text_config.linear_attn_config.gate_lower_bound", Some(json!(2.0))), "gate_lower_bound"),
        (edited("text_config.linear_attn_config.gate_lower_bound", None), "gate_lower_bound"),
        (edited("text_config.num_experts_per_token", Some(json!(1000))), "num_experts_per_token"),
        (edited("text_config.num_expert_group", Some(json!(5))), "num_expert_group"),
        (edited("text_config.topk_group", Some(json!(3))), "topk_group"),
        (edited("text_config.moe_intermediate_size", Some(json!(3000))), "moe_intermediate_size"),
        (edited("text_config.routed_expert_hidden_size", Some(json!(3590))), "routed_expert_hidden_size"),
        (edited("text_config.num_key_value_heads", Some(json!(8))), "num_key_value_heads"),
        (edited("text_config.index_rope_dim", Some(json!(64))), "index_rope_dim"),
        (edited("text_config.index_topk_freq", Some(json!(2))), "index_topk_freq"),
        (edited("text_config.index_use_hadamard", Some(json!(true))), "index_use_hadamard"),
        (edited("text_config.index_topk", Some(json!(0))), "index_topk"),
        (edited("text_config.hidden_act", Some(json!("gelu"))), "hidden_act"),
        (edited("text_config.moe_router_activation_func", Some(json!("softmax"))), "moe_router_activation_func"),
        (edited("text_config.attn_res_block_size", None), "attn_res_block_size"),
        (edited("text_config.quantization_config.format", Some(json!("nvfp4-pack-quantized"))), "quantization_config.format"),
        (edited("text_config.quantization_config.quant_method", Some(json!("gptq"))), "quant_method"),
        (edited("text_config.quantization_config.kv_cache_scheme", Some(json!({"num_bits": 8}))), "kv_cache_scheme"),
        (
            edited("text_config.quantization_config.config_groups.group_0.weights.group_size", Some(json!(16))),
            "group_size",
        ),
        (edited("text_config.tie_word_embeddings", Some(json!(true))), "tie_word_embeddings"),
        (edited("text_config.mla_use_nope", Some(json!(false))), "mla_use_nope"),
    ];
    for (v, key) in cases {
        let e = err_of(&v);
        assert!(e.contains(key), "error for `{key}` does not name it: {e}");
    }
}

#[test]
fn transformers_layer_lists_must_cover_every_layer() {
    let mut v = moonshot_kimi_linear();
    edit(&mut v, "linear_attn_config", None);
    edit(&mut v, "linear_num_heads", Some(json!(2)));
    edit(&mut v, "linear_head_dim", Some(json!(128)));
    edit(&mut v, "layer_types", Some(json!(["linear_attention", "linear_attention", "full_attention"])));
    let e = err_of(&v);
    assert!(e.contains("layer_types") && e.contains("3 layers"), "{e}");
    edit(&mut v, "layer_types", Some(json!(["linear_attention", "sliding", "full_attention", "linear_attention"])));
    assert!(err_of(&v).contains("layer_types[1]"));
    edit(&mut v, "layer_types", Some(json!(["linear_attention", "linear_attention", "full_attention", "linear_attention"])));
    edit(&mut v, "mlp_layer_types", Some(json!(["dense", "sparse"])));
    assert!(err_of(&v).contains("mlp_layer_types"));
    edit(&mut v, "mlp_layer_types", Some(json!(["dense", "sparse", "sparse", "sparse"])));
    ModelConfig::from_json(&v).expect("fixed config parses");
    // Two aliases of one key that disagree.
    edit(&mut v, "num_local_experts", Some(json!(16)));
    let e = err_of(&v);
    assert!(e.contains("num_local_experts") && e.contains("num_experts"), "{e}");
}

#[test]
fn unreadable_configs_are_errors_not_panics() {
    let dir = std::env::temp_dir().join(format!("k31-config-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let f = dir.join("config.json");
    std::fs::write(&f, "{ not json").expect("write");
    assert!(matches!(ModelConfig::from_path(&f), Err(ConfigError::Json { .. })));
    std::fs::write(&f, "[1, 2]").expect("write");
    assert!(ModelConfig::from_path(&f).is_err());
    assert!(matches!(ModelConfig::from_path(&dir.join("missing.json")), Err(ConfigError::Io { .. })));
    let _ = std::fs::remove_dir_all(&dir);
}
