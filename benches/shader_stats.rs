//! What the Vulkan driver made of each kernel: registers, spills, local memory, instruction
//! counts, whatever the driver reports through VK_KHR_pipeline_executable_properties (wgpu
//! does not expose it, so this builds each pipeline itself with ash on SPIR-V that naga
//! writes with wgpu's Vulkan options). Answers "did that array go to local memory?" without
//! a profiler. Not a timing.
//!
//! `cargo bench --bench shader_stats -- [NAME ...] [--exact] [--checked] [--ir DIR]`
//! - NAME: kernels whose name contains NAME (default: every kernel); `--exact`: named NAME.
//! - `--checked`: also build each kernel with the runtime checks wgpu adds to kernels not
//!   marked `unchecked` (array index clamps, loop bounding, integer division checks), to see
//!   what they cost. Without it each kernel is built as the engine builds it.
//! - `--ir DIR`: write the driver's internal representations (text ones) to DIR (NVIDIA's
//!   580 driver offers none; tools/nvidia_sass.py gets the SASS from its shader cache).

use std::ffi::{CStr, c_char};

use anyhow::{Context, Result, bail};
use ash::vk;
use k31_engine::gpu::pipelines::Kernel;
use k31_engine::{ops, shaders};

struct Vulkan {
    _entry: ash::Entry,
    instance: ash::Instance,
    device: ash::Device,
    executables: ash::khr::pipeline_executable_properties::Device,
    coopmat: bool,
    name: String,
}

fn text(chars: &[c_char]) -> String {
    // SAFETY: Vulkan strings are NUL-terminated within their fixed arrays.
    unsafe { CStr::from_ptr(chars.as_ptr()) }.to_string_lossy().into_owned()
}

fn open() -> Result<Vulkan> {
    // SAFETY: plain Vulkan setup; every handle lives as long as `Vulkan`.
    unsafe {
        let entry = ash::Entry::load().context("no Vulkan loader")?;
        let app = vk::ApplicationInfo::default().api_version(vk::API_VERSION_1_3);
        let instance = entry.create_instance(&vk::InstanceCreateInfo::default().application_info(&app), None)?;
        let devices = instance.enumerate_physical_devices()?;
        let pd = *devices
            .iter()
            .find(|&&d| instance.get_physical_device_properties(d).device_type != vk::PhysicalDeviceType::CPU)
            .or(devices.first())
            .context("no Vulkan device")?;
        let name = text(&instance.get_physical_device_properties(pd).device_name);
        let exts = instance.enumerate_device_extension_properties(pd)?;
        let has = |n: &CStr| exts.iter().any(|e| e.extension_name_as_c_str() == Ok(n));
        if !has(ash::khr::pipeline_executable_properties::NAME) {
            bail!("{name} does not offer VK_KHR_pipeline_executable_properties");
        }
        let coopmat = has(ash::khr::cooperative_matrix::NAME);
        // Enable every feature the device offers: the kernels' SPIR-V asks for what it uses.
        let mut f11 = vk::PhysicalDeviceVulkan11Features::default();
        let mut f12 = vk::PhysicalDeviceVulkan12Features::default();
        let mut f13 = vk::PhysicalDeviceVulkan13Features::default();
        let mut fexe = vk::PhysicalDevicePipelineExecutablePropertiesFeaturesKHR::default();
        let mut fcoop = vk::PhysicalDeviceCooperativeMatrixFeaturesKHR::default();
        let mut features = vk::PhysicalDeviceFeatures2::default()
            .push_next(&mut f11)
            .push_next(&mut f12)
            .push_next(&mut f13)
            .push_next(&mut fexe);
        if coopmat {
            features = features.push_next(&mut fcoop);
        }
        instance.get_physical_device_features2(pd, &mut features);
        let family = instance
            .get_physical_device_queue_family_properties(pd)
            .iter()
            .position(|q| q.queue_flags.contains(vk::QueueFlags::COMPUTE))
            .context("no compute queue")? as u32;
        let priorities = [1.0f32];
        let queues = [vk::DeviceQueueCreateInfo::default().queue_family_index(family).queue_priorities(&priorities)];
        let mut names = vec![ash::khr::pipeline_executable_properties::NAME.as_ptr()];
        if coopmat {
            names.push(ash::khr::cooperative_matrix::NAME.as_ptr());
        }
        let info = vk::DeviceCreateInfo::default().queue_create_infos(&queues).enabled_extension_names(&names).push_next(&mut features);
        let device = instance.create_device(pd, &info, None)?;
        let executables = ash::khr::pipeline_executable_properties::Device::new(&instance, &device);
        Ok(Vulkan { _entry: entry, instance, device, executables, coopmat, name })
    }
}

/// A resource binding: (group, binding, descriptor type).
type Binding = (u32, u32, vk::DescriptorType);

/// SPIR-V of `k` as wgpu's Vulkan backend writes it for the engine (the module `specialise`d
/// as `PipelineCache::get` does; NVIDIA has robust buffer access, so no buffer checks either
/// way), plus the module's bindings.
fn spirv(k: &Kernel, checked: bool) -> Result<(Vec<u32>, Vec<Binding>)> {
    let src = shaders::source(k.shader).context("unknown shader")?;
    let module = k31_engine::gpu::pipelines::specialise(src, k.entry, k.constants).map_err(|e| anyhow::anyhow!(e))?;
    let caps = naga::valid::Capabilities::all();
    let info = naga::valid::Validator::new(naga::valid::ValidationFlags::all(), caps).validate(&module)?;
    let mut options = naga::back::spv::Options {
        lang_version: (1, 6),
        zero_initialize_workgroup_memory: naga::back::spv::ZeroInitializeWorkgroupMemoryMode::Native,
        force_loop_bounding: checked,
        emit_int_div_checks: checked,
        ..Default::default()
    };
    options.flags.remove(naga::back::spv::WriterFlags::DEBUG);
    options.bounds_check_policies.index =
        if checked { naga::proc::BoundsCheckPolicy::Restrict } else { naga::proc::BoundsCheckPolicy::Unchecked };
    options.bounds_check_policies.buffer = naga::proc::BoundsCheckPolicy::Unchecked;
    let stage = naga::back::spv::PipelineOptions { shader_stage: naga::ShaderStage::Compute, entry_point: k.entry.into() };
    let words = naga::back::spv::write_vec(&module, &info, &options, Some(&stage))?;
    let mut bindings = Vec::new();
    for (_, var) in module.global_variables.iter() {
        let Some(b) = &var.binding else { continue };
        let ty = match var.space {
            naga::AddressSpace::Uniform => vk::DescriptorType::UNIFORM_BUFFER,
            naga::AddressSpace::Storage { .. } => vk::DescriptorType::STORAGE_BUFFER,
            other => bail!("binding of space {other:?}"),
        };
        bindings.push((b.group, b.binding, ty));
    }
    Ok((words, bindings))
}

struct Built {
    stats: Vec<(String, String)>,
    ir: Vec<(String, String)>,
}

fn build(vk: &Vulkan, words: &[u32], bindings: &[Binding], entry: &str, want_ir: bool) -> Result<Built> {
    // SAFETY: objects are created and destroyed here; the pipeline is never bound.
    unsafe {
        let d = &vk.device;
        let shader = d.create_shader_module(&vk::ShaderModuleCreateInfo::default().code(words), None)?;
        let groups = bindings.iter().map(|b| b.0 + 1).max().unwrap_or(0);
        let mut layouts = Vec::new();
        for g in 0..groups {
            let list: Vec<_> = bindings
                .iter()
                .filter(|b| b.0 == g)
                .map(|&(_, binding, ty)| {
                    vk::DescriptorSetLayoutBinding::default()
                        .binding(binding)
                        .descriptor_type(ty)
                        .descriptor_count(1)
                        .stage_flags(vk::ShaderStageFlags::COMPUTE)
                })
                .collect();
            layouts.push(d.create_descriptor_set_layout(&vk::DescriptorSetLayoutCreateInfo::default().bindings(&list), None)?);
        }
        let layout = d.create_pipeline_layout(&vk::PipelineLayoutCreateInfo::default().set_layouts(&layouts), None)?;
        let name = std::ffi::CString::new(entry)?;
        let stage = vk::PipelineShaderStageCreateInfo::default().stage(vk::ShaderStageFlags::COMPUTE).module(shader).name(&name);
        let flags = vk::PipelineCreateFlags::CAPTURE_STATISTICS_KHR
            | if want_ir { vk::PipelineCreateFlags::CAPTURE_INTERNAL_REPRESENTATIONS_KHR } else { vk::PipelineCreateFlags::empty() };
        let info = vk::ComputePipelineCreateInfo::default().flags(flags).stage(stage).layout(layout);
        let pipeline = d
            .create_compute_pipelines(vk::PipelineCache::null(), &[info], None)
            .map_err(|(_, e)| anyhow::anyhow!("vkCreateComputePipelines: {e}"))?[0];
        let mut built = Built { stats: Vec::new(), ir: Vec::new() };
        let exes = vk.executables.get_pipeline_executable_properties(&vk::PipelineInfoKHR::default().pipeline(pipeline))?;
        for (i, _) in exes.iter().enumerate() {
            let exe = vk::PipelineExecutableInfoKHR::default().pipeline(pipeline).executable_index(i as u32);
            for s in vk.executables.get_pipeline_executable_statistics(&exe)? {
                let v = match s.format {
                    vk::PipelineExecutableStatisticFormatKHR::BOOL32 => format!("{}", s.value.b32 != 0),
                    vk::PipelineExecutableStatisticFormatKHR::INT64 => format!("{}", s.value.i64),
                    vk::PipelineExecutableStatisticFormatKHR::UINT64 => format!("{}", s.value.u64),
                    _ => format!("{:.3}", s.value.f64),
                };
                built.stats.push((text(&s.name), v));
            }
            if want_ir {
                // Two calls: sizes, then the data.
                let mut reps = vk.executables.get_pipeline_executable_internal_representations(&exe)?;
                let mut store: Vec<Vec<u8>> = reps.iter().map(|r| vec![0u8; r.data_size]).collect();
                for (r, buf) in reps.iter_mut().zip(store.iter_mut()) {
                    r.p_data = buf.as_mut_ptr().cast();
                }
                let mut count = reps.len() as u32;
                (vk.executables.fp().get_pipeline_executable_internal_representations_khr)(
                    d.handle(),
                    &exe,
                    &mut count,
                    reps.as_mut_ptr(),
                )
                .result()?;
                for (r, buf) in reps.iter().zip(store) {
                    if r.is_text != 0 {
                        let body = String::from_utf8_lossy(&buf).trim_end_matches('\0').to_string();
                        built.ir.push((text(&r.name), body));
                    }
                }
            }
        }
        d.destroy_pipeline(pipeline, None);
        d.destroy_pipeline_layout(layout, None);
        for l in layouts {
            d.destroy_descriptor_set_layout(l, None);
        }
        d.destroy_shader_module(shader, None);
        Ok(built)
    }
}

fn main() -> Result<()> {
    let args: Vec<String> = std::env::args().skip(1).filter(|a| a != "--bench").collect();
    let checked_too = args.iter().any(|a| a == "--checked");
    let exact = args.iter().any(|a| a == "--exact");
    let ir_dir = args.iter().position(|a| a == "--ir").and_then(|i| args.get(i + 1)).cloned();
    let mut filters = Vec::new();
    let mut rest = args.iter();
    while let Some(a) = rest.next() {
        if a == "--ir" {
            rest.next();
        } else if !a.starts_with("--") {
            filters.push(a.clone());
        }
    }
    let vk = open()?;
    println!("device: {}", vk.name);
    if let Some(dir) = &ir_dir {
        std::fs::create_dir_all(dir)?;
    }
    for k in ops::all_kernels() {
        if !filters.is_empty() && !filters.iter().any(|f| if exact { k.name == f.as_str() } else { k.name.contains(f.as_str()) }) {
            continue;
        }
        if k.needs_coopmat && !vk.coopmat {
            continue;
        }
        let mut modes = vec![("as built", !k.unchecked)];
        if checked_too && k.unchecked {
            modes.push(("checked", true));
        } else if checked_too {
            modes.push(("unchecked", false));
        }
        for (label, checked) in modes {
            let result = spirv(&k, checked).and_then(|(words, bindings)| build(&vk, &words, &bindings, k.entry, ir_dir.is_some()));
            match result {
                Ok(b) => {
                    let stats: Vec<String> = b.stats.iter().map(|(n, v)| format!("{n}={v}")).collect();
                    println!("{:<32} {:<9} {}", k.name, label, stats.join("  "));
                    if let Some(dir) = &ir_dir {
                        for (n, body) in b.ir {
                            let file = format!("{dir}/{}.{}.{}.txt", k.name, label.replace(' ', "_"), n.replace(|c: char| !c.is_ascii_alphanumeric(), "_"));
                            std::fs::write(file, body)?;
                        }
                    }
                }
                Err(e) => println!("{:<32} {:<9} error: {e:#}", k.name, label),
            }
        }
    }
    // SAFETY: nothing is in flight.
    unsafe {
        vk.device.destroy_device(None);
        vk.instance.destroy_instance(None);
    }
    Ok(())
}
