#![recursion_limit = "256"]
//! k31-engine: everything that computes. See docs/architecture.md for the data flow.
//!
//! config.json -> [`config::ModelConfig`] -> [`layout`] (the tensors it implies)
//! *.safetensors -> [`checkpoint::Checkpoint`] (mapped, validated before any upload)
//! [`gpu`] (adapter, device, split tensors, pipelines, profiler) runs the [`ops`], each
//! checked against its CPU twin in [`reference`].

pub mod bench;
pub mod checkpoint;
pub mod config;
pub mod experts;
pub mod generate;
pub mod gpu;
pub mod init;
pub mod layers;
pub mod layout;
pub mod model;
pub mod ops;
pub mod plan;
pub mod reference;
pub mod sample;
pub mod session;
pub mod shaders;

/// Re-exported so tests and benches can name encoder and buffer types.
pub use wgpu;
pub mod tokenizer;
pub mod trace;
pub mod wgsl_include;
