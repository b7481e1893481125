//! The usage text of an example: its module doc comment, as `--help` prints
//! it (shared by the examples of `host` and `remat`, which include this file
//! with `#[path]`).

/// The `//!` lines at the top of `source`, without the comment marks and the
/// code-fence lines.
pub fn from_module_doc(source: &str) -> String {
    let lines: Vec<&str> = source
        .lines()
        .map_while(|l| l.strip_prefix("//!"))
        .map(|l| l.strip_prefix(' ').unwrap_or(l))
        .filter(|l| !l.starts_with("```"))
        .collect();
    lines.join("\n")
}
