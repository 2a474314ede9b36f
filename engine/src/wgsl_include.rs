//! `#include "lib/name.wgsl"` lines in shader files: WGSL has no includes, so code several
//! shaders share lives once under shaders/lib/ and is pasted in before a module is embedded
//! (build.rs), loaded from `K31_SHADER_DIR`, or compared by the tests. Paths are relative to
//! the shader directory; a file is pasted once per module however often it is named.
//! `#include "lib/name.wgsl" A=B C=D` pastes it with the identifiers A and C renamed to B and
//! D (once per distinct renaming): one body over several bindings, which WGSL cannot pass to
//! a function. Shared by build.rs through `#[path]`, so it uses std alone.

/// `text` with every include line replaced by the named file's (expanded) text; `read` loads
/// a file by its include path.
pub fn expand(text: &str, read: &mut dyn FnMut(&str) -> Result<String, String>) -> Result<String, String> {
    let mut seen = Vec::new();
    expand_into(text, read, &mut seen, 0)
}

fn expand_into(text: &str, read: &mut dyn FnMut(&str) -> Result<String, String>, seen: &mut Vec<String>, depth: usize) -> Result<String, String> {
    if depth > 8 {
        return Err("includes nested more than 8 deep (a cycle?)".into());
    }
    let mut out = String::with_capacity(text.len());
    for line in text.split_inclusive('\n') {
        let Some(rest) = line.trim_start().strip_prefix("#include") else {
            out.push_str(line);
            continue;
        };
        let malformed = || format!("malformed include line `{}`: expected #include \"path\" [NAME=NEW ...]", line.trim_end());
        let rest = rest.trim().strip_prefix('"').ok_or_else(malformed)?;
        let (name, renames) = rest.split_once('"').ok_or_else(malformed)?;
        let renames: Vec<(&str, &str)> = renames.split_whitespace().map(|r| r.split_once('=').ok_or_else(malformed)).collect::<Result<_, _>>()?;
        let key = rest.trim_end().to_string();
        if seen.contains(&key) {
            continue;
        }
        seen.push(key);
        let inner = read(name).map_err(|e| format!("include \"{name}\": {e}"))?;
        out.push_str(&rename(&expand_into(&inner, read, seen, depth + 1)?, &renames));
        if !out.is_empty() && !out.ends_with('\n') {
            out.push('\n');
        }
    }
    Ok(out)
}

/// `text` with every whole identifier `from` of `renames` replaced by its `to`.
fn rename(text: &str, renames: &[(&str, &str)]) -> String {
    if renames.is_empty() {
        return text.to_string();
    }
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    let mut out = String::with_capacity(text.len());
    let mut word = String::new();
    for c in text.chars().chain(std::iter::once('\n')) {
        if ident(c) {
            word.push(c);
            continue;
        }
        out.push_str(renames.iter().find(|(from, _)| *from == word).map_or(word.as_str(), |(_, to)| to));
        word.clear();
        out.push(c);
    }
    out.pop();
    out
}

#[cfg(test)]
mod tests {
    use super::expand;

    fn files(name: &str) -> Result<String, String> {
        match name {
            "lib/a.wgsl" => Ok("fn a() {}\n#include \"lib/b.wgsl\"".into()),
            "lib/b.wgsl" => Ok("fn b() {}\n".into()),
            "lib/loop.wgsl" => Ok("#include \"lib/loop2.wgsl\"\n".into()),
            "lib/loop2.wgsl" => Ok("#include \"lib/loop.wgsl\"\n".into()),
            _ => Err("no such file".into()),
        }
    }

    #[test]
    fn includes_expand_once_nested_and_report_bad_lines() {
        let text = "x\n  #include \"lib/a.wgsl\"\n#include \"lib/b.wgsl\"\ny\n";
        assert_eq!(expand(text, &mut files).unwrap(), "x\nfn a() {}\nfn b() {}\ny\n");
        assert!(expand("#include lib/a.wgsl\n", &mut files).unwrap_err().contains("malformed include"));
        assert!(expand("#include \"lib/none.wgsl\"\n", &mut files).unwrap_err().contains("lib/none.wgsl"));
        // A cycle stops at the once-per-module rule.
        assert_eq!(expand("#include \"lib/loop.wgsl\"\n", &mut files).unwrap(), "");
        // Renamed copies: once per renaming, whole identifiers only.
        let text = "#include \"lib/b.wgsl\" b=b0\n#include \"lib/b.wgsl\" b=b1\n#include \"lib/b.wgsl\" b=b1\n";
        assert_eq!(expand(text, &mut files).unwrap(), "fn b0() {}\nfn b1() {}\n");
        assert!(expand("#include \"lib/b.wgsl\" b\n", &mut files).unwrap_err().contains("malformed include"));
    }
}
