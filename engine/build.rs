//! Embeds every `shaders/*.wgsl` file: the registry is generated, so adding a shader file
//! is all it takes for the pipeline cache and the portability tests to see it.

use std::fmt::Write as _;

fn main() {
    // Read at run time: a build-script binary can be shared by checkouts at other paths.
    let manifest = std::env::var("CARGO_MANIFEST_DIR").expect("cargo sets CARGO_MANIFEST_DIR");
    let dir = std::path::Path::new(&manifest).join("../shaders");
    println!("cargo:rerun-if-changed={}", dir.display());
    let mut names: Vec<String> = std::fs::read_dir(&dir)
        .expect("reading shaders/")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().is_some_and(|x| x == "wgsl"))
        .filter_map(|p| p.file_stem().and_then(|s| s.to_str()).map(str::to_string))
        .collect();
    names.sort();
    let mut out = String::from("pub const SHADERS: &[(&str, &str)] = &[\n");
    for n in &names {
        let path = dir.join(format!("{n}.wgsl"));
        println!("cargo:rerun-if-changed={}", path.display());
        let _ = writeln!(out, "    ({n:?}, include_str!({:?})),", path.display().to_string());
    }
    out.push_str("];\n");
    let dest = std::path::Path::new(&std::env::var("OUT_DIR").expect("OUT_DIR")).join("shaders.rs");
    std::fs::write(dest, out).expect("writing the shader registry");
}
