//! The `k31` binary end to end: inspect, init, devices, and clear errors (never a panic).

mod support;

use std::path::Path;
use std::process::{Command, Output};

fn k31(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_k31")).args(args).output().expect("running k31")
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

const K31_CONFIG: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/models/configs/kimi-k3.1-pro.json");

/// A failed run must exit 1 with an `error:` line and no panic.
fn assert_clean_failure(o: &Output, needle: &str) {
    let err = stderr(o);
    assert_eq!(o.status.code(), Some(1), "exit status; stderr:\n{err}");
    assert!(err.contains("error:"), "{err}");
    assert!(!err.contains("panicked"), "panic instead of an error:\n{err}");
    assert!(err.contains(needle), "stderr lacks `{needle}`:\n{err}");
}

#[test]
fn inspect_full_k31_config() {
    let o = k31(&["inspect", K31_CONFIG]);
    assert!(o.status.success(), "{}", stderr(&o));
    let out = stdout(&o);
    assert!(out.contains("93 (69 KDA, 24 global"), "{out}");
    assert!(out.contains("33,792 B per token"), "{out}");
    assert!(out.contains("top-2048"), "{out}");
    assert!(out.contains("414.0 MiB recurrent"), "{out}");

    let o = k31(&["inspect", K31_CONFIG, "--json", "--context", "1048576"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("inspect --json prints JSON");
    assert_eq!(v["layers"], 93);
    assert_eq!(v["kda_layers"], 69);
    assert_eq!(v["global_layers"], 24);
    assert_eq!(v["global_cache_bytes_per_token"], 33_792);
    assert_eq!(v["plan"]["global_cache_bytes"], 33_792u64 * 1_048_576);
    assert!(v["params"]["active_per_token"].as_u64().expect("count") < v["params"]["total"].as_u64().expect("count"));
}

#[test]
fn init_then_inspect_tiny() {
    let dir = support::scratch("cli-init").join("tiny");
    let d = dir.to_str().expect("utf-8 path");
    let o = k31(&["init", "--preset", "tiny", "--seed", "5", d]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(Path::new(d).join("model.safetensors").exists());
    let o = k31(&["inspect", d, "--json"]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("JSON");
    assert_eq!(v["weights_from_files"], true);
    assert_eq!(v["layers"], 8);
    // A second init into the same directory refuses to overwrite it.
    assert_clean_failure(&k31(&["init", "--preset", "tiny", d]), "already holds a model");
}

#[test]
fn init_size_flags() {
    let dir = support::scratch("cli-init-flags").join("m");
    let d = dir.to_str().expect("utf-8 path");
    let o = k31(&["init", "--preset", "tiny", "--layers", "5", "--experts", "3", "--vocab", "600", d]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value =
        serde_json::from_str(&stdout(&k31(&["inspect", d, "--json"]))).expect("JSON");
    assert_eq!(v["layers"], 5);
    assert_eq!(v["global_layer_indices"], serde_json::json!([4, 5]));
    assert_eq!(v["config"]["moe"]["num_experts"], 3);
    assert_eq!(v["config"]["moe"]["experts_per_token"], 3);
    assert_eq!(v["vocab_size"], 600);
}

#[test]
fn bad_input_is_a_clear_error() {
    assert_clean_failure(&k31(&["inspect", "/nonexistent/model"]), "/nonexistent/model");
    assert_clean_failure(&k31(&["init", "--preset", "huge", "/tmp/x"]), "unknown preset `huge`");
    assert_clean_failure(&k31(&["init", "--preset", "tiny", "--layers", "0", "/tmp/x"]), "--layers");
    let dir = support::scratch("cli-bad");
    std::fs::write(dir.join("config.json"), r#"{"architectures": ["GPT2LMHeadModel"]}"#).expect("write");
    assert_clean_failure(&k31(&["inspect", dir.to_str().expect("utf-8")]), "GPT2LMHeadModel");
    std::fs::write(dir.join("config.json"), "{").expect("write");
    let o = k31(&["inspect", dir.to_str().expect("utf-8")]);
    assert_clean_failure(&o, "not valid JSON");
    // The cause once: error types that print their source must not get it appended again.
    let err = stderr(&o);
    assert_eq!(err.matches("EOF while parsing").count(), 1, "{err}");
    // Weights present but broken: the checkpoint error, listing the problem.
    let src = support::golden::golden_dir().join("k31_tiny/model/config.json");
    std::fs::copy(src, dir.join("config.json")).expect("copy");
    std::fs::write(dir.join("model.safetensors"), b"\x10\x00\x00\x00\x00\x00\x00\x00{}").expect("write");
    assert_clean_failure(&k31(&["inspect", dir.to_str().expect("utf-8")]), "model.safetensors");
}

#[test]
fn devices_lists_adapters() {
    let o = k31(&["devices", "--json"]);
    if !o.status.success() {
        // No adapter on this machine: the message must say how to get one.
        assert_clean_failure(&o, "mesa-vulkan-drivers");
        return;
    }
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("JSON");
    let adapters = v["adapters"].as_array().expect("list");
    assert!(!adapters.is_empty());
    assert!(adapters[0]["max_storage_buffer_binding_size"].as_u64().expect("limit") > 0);
    // An adapter selector that matches nothing: `chosen` is null, the list is still shown.
    let o = k31(&["--adapter", "no-such-gpu", "devices", "--json"]);
    let v: serde_json::Value = serde_json::from_str(&stdout(&o)).expect("JSON");
    assert!(v["chosen"].is_null());
}

#[test]
fn no_adapter_names_the_fix() {
    // A backend this machine cannot have: no adapters at all.
    let backend = if cfg!(target_os = "macos") { "dx12" } else { "metal" };
    let o = Command::new(env!("CARGO_BIN_EXE_k31")).args(["devices"]).env("WGPU_BACKEND", backend).output().expect("run");
    assert_clean_failure(&o, "no usable GPU adapter");
    assert!(stderr(&o).contains("mesa-vulkan-drivers"));
}

/// A tiny model written by `k31 init`, shared by the generate tests.
fn init_tiny(name: &str) -> String {
    let dir = support::scratch(name).join("m");
    let d = dir.to_str().expect("utf-8 path").to_string();
    let o = k31(&["init", "--preset", "tiny", "--seed", "7", &d]);
    assert!(o.status.success(), "{}", stderr(&o));
    d
}

#[test]
fn generate_streams_text_and_reports_json() {
    if support::gpu().is_none() {
        return;
    }
    let d = init_tiny("cli-generate");
    let args = ["generate", "--model", &d, "--prompt", "Hello there", "--max-tokens", "3", "--json", "--metrics"];
    let o = k31(&args);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).expect("one JSON object");
    assert_eq!(v["tokens"].as_array().expect("tokens").len(), 3, "{v}");
    assert_eq!(v["stop_reason"], "MaxTokens");
    assert!(v["metrics"]["decode_tokens_per_second"].as_f64().expect("metric") > 0.0);
    assert!(v["metrics"].get("peak_gpu_bytes").is_some(), "peak GPU memory is reported: {v}");
    // A fresh process builds its pipelines during the prefill, and says how long that took.
    assert!(v["metrics"]["prefill_pipeline_seconds"].as_f64().expect("metric") > 0.0, "{v}");
    let ops: Vec<String> = v["metrics"]["gpu_seconds_by_op"].as_array().expect("ops").iter().map(|p| p[0].to_string()).collect();
    for family in ["topk", "index_scores", "mla_attend"] {
        assert!(ops.iter().any(|o| o.contains(family)), "no {family} in {ops:?}");
    }
    // Greedy is deterministic: the same tokens again.
    let again: serde_json::Value = serde_json::from_str(stdout(&k31(&args)).trim()).expect("JSON");
    assert_eq!(again["tokens"], v["tokens"]);
    // Bad input: empty prompt, too-long prompt, unknown model dir.
    assert_clean_failure(&k31(&["generate", "--model", &d, "--prompt", ""]), "prompt is empty");
    // Out-of-range sampling settings, negative ones included, are named by the sampler.
    assert_clean_failure(&k31(&["generate", "--model", &d, "--prompt", "x", "--temperature", "-1"]), "temperature must be >= 0");
    assert_clean_failure(&k31(&["generate", "--model", &d, "--prompt", "x", "--top-p", "-0.5"]), "top-p must be in (0, 1]");
    let long = "a ".repeat(300);
    assert_clean_failure(&k31(&["generate", "--model", &d, "--prompt", &long, "--context", "64"]), "context");
    assert_clean_failure(&k31(&["generate", "--model", "/nonexistent", "--prompt", "x"]), "config.json");
    assert_clean_failure(&k31(&["generate", "--model", &d, "--prompt", "x", "--temperature=-1"]), "temperature");
    // The indexer query in bf16 (the reference model's rounding) runs; an unknown precision is named.
    let o = k31(&["generate", "--model", &d, "--prompt", "Hello there", "--max-tokens", "2", "--json", "--index-precision", "bf16"]);
    assert!(o.status.success(), "{}", stderr(&o));
    // (An argument error: clap's usage exit status 2.)
    let o = k31(&["generate", "--model", &d, "--prompt", "x", "--index-precision", "fp8"]);
    let err = stderr(&o);
    assert_eq!(o.status.code(), Some(2), "{err}");
    assert!(err.contains("f32 or bf16") && !err.contains("panicked"), "{err}");
}

#[test]
fn score_dumps_the_reference_logits() {
    if support::gpu().is_none() {
        return;
    }
    let golden = support::golden::golden_dir().join("k31_tiny");
    let ids: Vec<i64> = support::golden::load_int_tensors(golden.join("outputs.safetensors"))["input_ids"].1[..12].to_vec();
    let dir = support::scratch("cli-score");
    let ids_file = dir.join("ids.json");
    std::fs::write(&ids_file, serde_json::to_string(&ids).expect("json")).expect("write");
    let out = dir.join("logits.safetensors");
    let model = golden.join("model");
    let o = k31(&[
        "score", "--model", model.to_str().expect("utf-8"), "--token-ids", ids_file.to_str().expect("utf-8"),
        "--dump-logits", out.to_str().expect("utf-8"), "--json",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).expect("JSON");
    assert_eq!(v["logprobs"].as_array().expect("logprobs").len(), 11);
    assert!(v["perplexity"].as_f64().expect("ppl") > 1.0);
    let got = support::golden::load_tensors(&out);
    let (shape, logits) = support::golden::get(&got, "logits");
    assert_eq!(shape, &vec![12, 512]);
    // The first rows of the reference's full run see the same prefix.
    let outputs = support::golden::load_tensors(golden.join("outputs.safetensors"));
    let want = &support::golden::get(&outputs, "logits_full").1[..12 * 512];
    let rel = (logits.iter().zip(want).map(|(a, b)| ((a - b) as f64).powi(2)).sum::<f64>()
        / want.iter().map(|b| (*b as f64).powi(2)).sum::<f64>())
    .sqrt();
    // The engine keeps the latent and index-key caches in bf16 (the spec's cache budget)
    // where the reference keeps f32; on these 12 short rows that alone is ~1.5e-3.
    // tests/e2e.rs holds the whole 40-token run to the 1e-3 acceptance bound.
    assert!(rel <= 2e-3, "dumped logits rel L2 {rel}");
    // Past one prefill chunk (512 tokens): rows stream to the file chunk by chunk, and every
    // log-prob is that of its own dumped row, across the chunk boundary too.
    let long: Vec<i64> = (0..530).map(|i| (i * 37 + 5) % 512).collect();
    std::fs::write(&ids_file, serde_json::to_string(&long).expect("json")).expect("write");
    let o = k31(&[
        "score", "--model", model.to_str().expect("utf-8"), "--token-ids", ids_file.to_str().expect("utf-8"),
        "--dump-logits", out.to_str().expect("utf-8"), "--json", "--context", "600",
    ]);
    assert!(o.status.success(), "{}", stderr(&o));
    let v: serde_json::Value = serde_json::from_str(stdout(&o).trim()).expect("JSON");
    let lps: Vec<f64> = v["logprobs"].as_array().expect("logprobs").iter().map(|x| x.as_f64().expect("f64")).collect();
    assert_eq!(lps.len(), 529);
    let got = support::golden::load_tensors(&out);
    let (shape, logits) = support::golden::get(&got, "logits");
    assert_eq!(shape, &vec![530, 512]);
    for i in [0usize, 510, 511, 512, 528] {
        let row = &logits[i * 512..(i + 1) * 512];
        let m = row.iter().fold(f32::MIN, |a, &b| a.max(b)) as f64;
        let lse = m + row.iter().map(|&x| (x as f64 - m).exp()).sum::<f64>().ln();
        let want = row[long[i + 1] as usize] as f64 - lse;
        assert!((lps[i] - want).abs() < 1e-4, "log-prob {i}: {} vs its row's {want}", lps[i]);
    }
    assert!(!out.with_extension("logits.part").exists(), "the raw part file is left behind");
    // Ids outside the vocabulary, malformed id files.
    std::fs::write(&ids_file, "[1, 2, 9999]").expect("write");
    assert_clean_failure(&k31(&["score", "--model", model.to_str().expect("utf-8"), "--token-ids", ids_file.to_str().expect("utf-8")]), "9999");
    std::fs::write(&ids_file, "[1, -2]").expect("write");
    assert_clean_failure(&k31(&["score", "--model", model.to_str().expect("utf-8"), "--token-ids", ids_file.to_str().expect("utf-8")]), "element 1");
}

#[test]
fn selection_outputs_do_not_change_tokens() {
    if support::gpu().is_none() {
        return;
    }
    let d = init_tiny("cli-selection");
    let dir = support::scratch("cli-selection-out");
    let trace = dir.join("trace.jsonl");
    let png = dir.join("heat.png");
    let base = ["generate", "--model", &d, "--prompt", "one two three four", "--max-tokens", "3", "--json"];
    let plain: serde_json::Value = serde_json::from_str(stdout(&k31(&base)).trim()).expect("JSON");
    let mut with_sinks: Vec<&str> = base.to_vec();
    let (t, p) = (trace.to_str().expect("utf-8"), png.to_str().expect("utf-8"));
    with_sinks.extend(["--selection-trace", t, "--selection-png", p, "--omitted-mass"]);
    let o = k31(&with_sinks);
    assert!(o.status.success(), "{}", stderr(&o));
    let traced: serde_json::Value = serde_json::from_str(stdout(&o).trim()).expect("JSON");
    assert_eq!(traced["tokens"], plain["tokens"], "a selection sink must not change generation");
    assert!(traced["omitted_mass"].is_array());
    let t = k31_viewer::read_trace(&trace).expect("trace reads back");
    let prompt_len = plain["prompt_tokens"].as_array().expect("ids").len();
    // 2 global layers x (prompt + 2 decoded positions; the last token is never fed back).
    assert_eq!(t.selections.len(), 2 * (prompt_len + 2), "one selection per global layer per position");
    let (w, h, _) = k31_viewer::read_png(&png).expect("PNG");
    assert!(w > 0 && h > 0);
}

#[test]
fn view_opens_a_window_under_x() {
    if support::gpu().is_none() || std::env::var_os("DISPLAY").is_none() {
        eprintln!("skipping: no DISPLAY (CI runs this under xvfb-run)");
        return;
    }
    let d = init_tiny("cli-view");
    let o = k31(&["view", "--model", &d, "--prompt", "a b c", "--max-tokens", "2", "--exit-when-done"]);
    assert!(o.status.success(), "{}", stderr(&o));
    assert!(stderr(&o).contains("frames drawn"), "{}", stderr(&o));
}

/// `--prefix-cache`: the first run computes and saves the prompt's prefix, a longer prompt
/// starting with it restores it and gives the tokens of an uncached run; a prompt that does
/// not extend the cached prefix is a clear error.
#[test]
fn generate_with_a_prefix_cache_matches_a_plain_run() {
    if support::gpu().is_none() {
        return;
    }
    let d = init_tiny("cli-prefix");
    let cache = support::scratch("cli-prefix-cache").join("prefix.safetensors");
    let c = cache.to_str().expect("utf-8 path");
    let tokens = |prompt: &str, extra: &[&str]| -> serde_json::Value {
        let mut args = vec!["generate", "--model", &d, "--prompt", prompt, "--max-tokens", "4", "--json"];
        args.extend_from_slice(extra);
        let o = k31(&args);
        assert!(o.status.success(), "{}", stderr(&o));
        serde_json::from_str::<serde_json::Value>(stdout(&o).trim()).expect("JSON")["tokens"].clone()
    };
    let shared = "The quick brown fox jumps over the lazy dog";
    assert_eq!(tokens(shared, &["--prefix-cache", c]), tokens(shared, &[]), "run that writes the cache");
    assert!(cache.exists());
    let longer = format!("{shared} and then it runs away");
    assert_eq!(tokens(&longer, &["--prefix-cache", c]), tokens(&longer, &[]), "run that restores the cache");
    assert_clean_failure(&k31(&["generate", "--model", &d, "--prompt", "Something else", "--prefix-cache", c]), "does not begin this prompt");
}
