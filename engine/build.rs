//! Embeds every `shaders/*.wgsl` file, its `#include`s expanded (src/wgsl_include.rs): the
//! registry is generated, so adding a shader file is all it takes for the pipeline cache and
//! the portability tests to see it. shaders/lib/ holds the included pieces.

use std::fmt::Write as _;

#[path = "src/wgsl_include.rs"]
mod wgsl_include;

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
    println!("cargo:rerun-if-changed=src/wgsl_include.rs");
    let out_dir = std::path::PathBuf::from(std::env::var("OUT_DIR").expect("OUT_DIR"));
    let expanded_dir = out_dir.join("wgsl");
    std::fs::create_dir_all(&expanded_dir).expect("creating OUT_DIR/wgsl");
    let mut out = String::from("pub const SHADERS: &[(&str, &str)] = &[\n");
    for n in &names {
        let path = dir.join(format!("{n}.wgsl"));
        println!("cargo:rerun-if-changed={}", path.display());
        let text = std::fs::read_to_string(&path).expect("reading a shader");
        let mut read = |name: &str| std::fs::read_to_string(dir.join(name)).map_err(|e| e.to_string());
        let expanded = wgsl_include::expand(&text, &mut read).unwrap_or_else(|e| panic!("{}: {e}", path.display()));
        let dest = expanded_dir.join(format!("{n}.wgsl"));
        std::fs::write(&dest, expanded).expect("writing an expanded shader");
        let _ = writeln!(out, "    ({n:?}, include_str!({:?})),", dest.display().to_string());
    }
    out.push_str("];\n");
    std::fs::write(out_dir.join("shaders.rs"), out).expect("writing the shader registry");
}
