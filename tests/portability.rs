//! Every WGSL file validates with naga and translates to SPIR-V, MSL and HLSL, so a shader
//! that would break on Vulkan, Metal or DX12 fails CI; every kernel variant is expanded
//! with its override constants; every parameter struct matches its WGSL twin.

use k31_engine::{ops, shaders};
use naga::valid::{Capabilities, ValidationFlags, Validator};

/// The capabilities k31 may enable on a device; variants that need one declare it.
/// (f16-in-f32 packing is core WGSL; naga gates it only for GL ES downlevel devices.)
const CAPS: Capabilities = Capabilities::SUBGROUP
    .union(Capabilities::SUBGROUP_BARRIER)
    .union(Capabilities::SHADER_FLOAT16)
    .union(Capabilities::SHADER_INT64)
    .union(Capabilities::COOPERATIVE_MATRIX)
    .union(Capabilities::SHADER_FLOAT16_IN_FLOAT32);

fn validate(name: &str, src: &str) -> Result<(naga::Module, naga::valid::ModuleInfo), String> {
    let module = naga::front::wgsl::parse_str(src).map_err(|e| e.emit_to_string_with_path(src, name))?;
    let info = Validator::new(ValidationFlags::all(), CAPS)
        .validate(&module)
        .map_err(|e| e.emit_to_string_with_path(src, name))?;
    Ok((module, info))
}

/// Cooperative-matrix shaders exist for Vulkan only (each has a SIMT twin elsewhere).
fn uses_coopmat(src: &str) -> bool {
    src.contains("enable wgpu_cooperative_matrix;")
}

fn translate(name: &str, module: &naga::Module, info: &naga::valid::ModuleInfo, spirv_only: bool) -> Result<(), String> {
    naga::back::spv::write_vec(module, info, &naga::back::spv::Options::default(), None)
        .map_err(|e| format!("{name}: SPIR-V: {e}"))?;
    if spirv_only {
        return Ok(());
    }
    naga::back::msl::write_string(module, info, &Default::default(), &Default::default())
        .map_err(|e| format!("{name}: MSL: {e}"))?;
    let mut hlsl = String::new();
    naga::back::hlsl::Writer::new(&mut hlsl, &Default::default(), &Default::default())
        .write(module, info, None)
        .map_err(|e| format!("{name}: HLSL: {e}"))?;
    Ok(())
}

#[test]
fn every_shader_file_is_registered() {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("shaders");
    for entry in std::fs::read_dir(&dir).expect("reading shaders/") {
        let path = entry.expect("shaders/ entry").path();
        if path.extension().and_then(|e| e.to_str()) != Some("wgsl") {
            continue;
        }
        let stem = path.file_stem().and_then(|s| s.to_str()).expect("utf-8 shader name");
        let embedded = shaders::source(stem).unwrap_or_else(|| panic!("{} is not listed in engine/src/shaders.rs", path.display()));
        let on_disk = std::fs::read_to_string(&path).expect("reading shader");
        let mut read = |name: &str| std::fs::read_to_string(dir.join(name)).map_err(|e| e.to_string());
        let on_disk = k31_engine::wgsl_include::expand(&on_disk, &mut read).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        assert_eq!(embedded, on_disk, "{stem}: embedded source differs from the file");
    }
}

#[test]
fn every_shader_validates_and_translates() {
    let mut errors = Vec::new();
    for (name, src) in shaders::SHADERS {
        match validate(name, src) {
            Ok((m, i)) => {
                // Override constants take their defaults here; the variants test sets them.
                match naga::back::pipeline_constants::process_overrides(&m, &i, None, &Default::default()) {
                    Ok((m, i)) => {
                        if let Err(e) = translate(name, &m, &i, uses_coopmat(src)) {
                            errors.push(e);
                        }
                    }
                    Err(e) => errors.push(format!("{name}: overrides: {e}")),
                }
            }
            Err(e) => errors.push(e),
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}

/// NVIDIA's Vulkan limit on workgroup memory: a kernel that declares more hangs the H200
/// without an error (docs/perf.md, KDA), and neither wgpu nor naga checks it, nor does
/// lavapipe enforce the 32 KiB it reports.
const MAX_WORKGROUP_BYTES: u32 = 48 * 1024;

/// Kernels that run on adapters with 32 KiB of workgroup memory (Metal, DX12): the ones ops
/// fall back to there, the ones that have no larger variant, and the SIMT kernels that are
/// the default wherever cooperative matrices are absent.
const PORTABLE_FALLBACKS: &[&str] = &[
    "mla_absorb",
    "mla_attend",
    "mla_attend_tiled",
    "mla_merge_out",
    "mla_merge_out_64",
    "kda_chunk_state16",
    "kda_chunk_intra",
    "kda_chunk_intra_ref",
    "kda_chunk_out",
    "linear_bf16",
    "linear_f32",
    "linear_any_bf16",
    "linear_any_f32",
    "moe_tiles",
    "expert_up_tiled_mxfp4",
    "expert_down_tiled_mxfp4",
    "expert_up_tiled_bf16",
    "expert_down_tiled_bf16",
];

#[test]
fn every_kernel_variant_specialises_and_translates() {
    let mut errors = Vec::new();
    for name in PORTABLE_FALLBACKS {
        if !ops::all_kernels().iter().any(|k| k.name == *name) {
            errors.push(format!("portable fallback {name} is not a kernel"));
        }
    }
    for k in ops::all_kernels() {
        let src = shaders::source(k.shader).unwrap_or_else(|| panic!("kernel {} names unknown shader {}", k.name, k.shader));
        let module = match validate(k.shader, src) {
            Ok((m, _)) => m,
            Err(e) => {
                errors.push(e);
                continue;
            }
        };
        if !module.entry_points.iter().any(|e| e.name == k.entry) {
            errors.push(format!("kernel {}: shader {} has no entry point {}", k.name, k.shader, k.entry));
            continue;
        }
        // The module as PipelineCache::get builds it (overrides applied, its entry point only,
        // the buffers it never writes read-only), validated with the capabilities k31 may enable.
        let resolved = k31_engine::gpu::pipelines::specialise(src, k.entry, k.constants).and_then(|m| {
            let i = Validator::new(ValidationFlags::all(), CAPS).validate(&m).map_err(|e| e.emit_to_string(src))?;
            Ok((m, i))
        });
        match resolved {
            Ok((m, i)) => {
                if let Err(e) = translate(k.name, &m, &i, k.needs_coopmat) {
                    errors.push(e);
                }
                let bytes = k31_engine::gpu::pipelines::workgroup_bytes(&m, &i, k.entry).expect("entry point");
                if bytes > MAX_WORKGROUP_BYTES {
                    errors.push(format!("kernel {}: {bytes} bytes of workgroup memory, over {MAX_WORKGROUP_BYTES}", k.name));
                }
                if PORTABLE_FALLBACKS.contains(&k.name) && bytes > 32 * 1024 {
                    errors.push(format!("kernel {}: the fallback for 32 KiB adapters uses {bytes} bytes of workgroup memory", k.name));
                }
            }
            Err(e) => errors.push(format!("kernel {}: specialising: {e}", k.name)),
        }
    }
    assert!(errors.is_empty(), "{}", errors.join("\n"));
}

#[test]
fn parameter_structs_match_their_wgsl_twins() {
    for p in ops::all_params() {
        let src = shaders::source(p.shader).expect("shader of a parameter struct");
        let module = naga::front::wgsl::parse_str(src).expect("parsing shader");
        let mut layouter = naga::proc::Layouter::default();
        layouter.update(module.to_ctx()).expect("layout");
        let (handle, ty) = module
            .types
            .iter()
            .find(|(_, t)| t.name.as_deref() == Some(p.name))
            .unwrap_or_else(|| panic!("{}: no struct {} in the WGSL", p.shader, p.name));
        let naga::TypeInner::Struct { members, span } = &ty.inner else { panic!("{} is not a struct", p.name) };
        assert_eq!(*span as usize, p.size, "{}: WGSL size {} vs Rust {}", p.name, span, p.size);
        let _ = layouter[handle];
        let wgsl: Vec<(String, usize)> =
            members.iter().map(|m| (m.name.clone().unwrap_or_default(), m.offset as usize)).collect();
        let rust: Vec<(String, usize)> = p.fields.iter().map(|(n, o)| (n.to_string(), *o)).collect();
        assert_eq!(wgsl, rust, "{}: field names/offsets differ between WGSL and Rust", p.name);
    }
}

/// Every kernel an op declares with `Kernel::new("name", ..)` is in `ops::all_kernels()`, the
/// table this file translates and `ops::prewarm` builds (kda_chunk_state_r was missing from it
/// for a session).
#[test]
fn every_declared_kernel_is_listed() {
    let listed: Vec<&str> = ops::all_kernels().iter().map(|k| k.name).collect();
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("engine/src/ops");
    let mut missing = Vec::new();
    for entry in std::fs::read_dir(&dir).expect("reading engine/src/ops") {
        let path = entry.expect("ops entry").path();
        let src = std::fs::read_to_string(&path).expect("reading an op");
        for (i, _) in src.match_indices("Kernel::new(\"") {
            let rest = &src[i + "Kernel::new(\"".len()..];
            let name = &rest[..rest.find('"').expect("closing quote")];
            if !listed.contains(&name) {
                missing.push(format!("{}: {name}", path.display()));
            }
        }
    }
    assert!(missing.is_empty(), "kernels missing from their op's KERNELS: {missing:?}");
}
