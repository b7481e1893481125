//! A Matrix Market reader: coordinate matrices with `pattern`, `integer` or
//! `real` values and `general` or `symmetric` symmetry, read as graphs (an
//! entry `i j` is the edge `i - 1 -> j - 1`; values are checked and dropped;
//! a symmetric entry off the diagonal gives both directions). `%` lines are
//! comments. Single-threaded; nothing shared.
//!
//! Every malformed input is an [`MtxError`] naming the line; nothing panics.

use std::fmt;
use std::io::BufRead;

use super::EdgeList;

/// Why a `.mtx` file cannot be read as a graph.
#[derive(Debug)]
pub enum MtxError {
    /// Reading failed.
    Io(std::io::Error),
    /// A line is not what the format allows there (1-based line number).
    Malformed {
        /// Line number.
        line: usize,
        /// What was wrong.
        why: String,
    },
    /// An entry names a vertex outside the declared size.
    OutOfRange {
        /// Line number.
        line: usize,
        /// The 1-based id as written.
        vertex: u64,
        /// Vertices declared in the size line.
        vertices: u64,
    },
    /// The graph has no vertices or no edges.
    Empty,
}

impl fmt::Display for MtxError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MtxError::Io(e) => write!(f, "cannot read the .mtx file: {e}"),
            MtxError::Malformed { line, why } => write!(f, ".mtx line {line}: {why}"),
            MtxError::OutOfRange {
                line,
                vertex,
                vertices,
            } => write!(
                f,
                ".mtx line {line}: vertex {vertex} is outside 1..={vertices} declared in the size line"
            ),
            MtxError::Empty => write!(f, "the .mtx graph is empty (no vertices or no entries)"),
        }
    }
}

impl std::error::Error for MtxError {}

/// How values are written.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Field {
    Pattern,
    Integer,
    Real,
}

fn malformed(line: usize, why: impl Into<String>) -> MtxError {
    MtxError::Malformed {
        line,
        why: why.into(),
    }
}

/// Parses the banner `%%MatrixMarket matrix coordinate FIELD SYMMETRY`;
/// returns the field and whether the matrix is symmetric.
fn banner(text: &str) -> Result<(Field, bool), MtxError> {
    let words: Vec<String> = text.split_whitespace().map(str::to_lowercase).collect();
    if words.len() != 5 || words[0] != "%%matrixmarket" || words[1] != "matrix" {
        return Err(malformed(
            1,
            "expected `%%MatrixMarket matrix coordinate <field> <symmetry>`",
        ));
    }
    if words[2] != "coordinate" {
        return Err(malformed(
            1,
            format!("format `{}` is not supported (only coordinate)", words[2]),
        ));
    }
    let field = match words[3].as_str() {
        "pattern" => Field::Pattern,
        "integer" => Field::Integer,
        "real" => Field::Real,
        other => {
            return Err(malformed(
                1,
                format!("field `{other}` is not supported (pattern, integer or real)"),
            ));
        }
    };
    let symmetric = match words[4].as_str() {
        "general" => false,
        "symmetric" => true,
        other => {
            return Err(malformed(
                1,
                format!("symmetry `{other}` is not supported (general or symmetric)"),
            ));
        }
    };
    Ok((field, symmetric))
}

fn number(line: usize, word: &str, what: &str) -> Result<u64, MtxError> {
    word.parse().map_err(|_| {
        malformed(
            line,
            format!("{what} `{word}` is not a non-negative integer"),
        )
    })
}

/// Reads a graph from Matrix Market text.
pub fn read(input: impl BufRead) -> Result<EdgeList, MtxError> {
    let mut lines = input.lines().enumerate().map(|(i, l)| (i + 1, l));
    let (_, first) = lines.next().ok_or(malformed(1, "the file is empty"))?;
    let (field, symmetric) = banner(&first.map_err(MtxError::Io)?)?;
    let mut size: Option<(u64, u64)> = None;
    let mut expected = 0u64;
    let mut edges = Vec::new();
    let mut entries = 0u64;
    let mut last_line = 1;
    for (n, text) in lines {
        last_line = n;
        let text = text.map_err(MtxError::Io)?;
        let text = text.trim();
        if text.is_empty() || text.starts_with('%') {
            continue;
        }
        let words: Vec<&str> = text.split_whitespace().collect();
        let Some((rows, cols)) = size else {
            if words.len() != 3 {
                return Err(malformed(n, "expected the size line `rows cols entries`"));
            }
            let rows = number(n, words[0], "row count")?;
            let cols = number(n, words[1], "column count")?;
            expected = number(n, words[2], "entry count")?;
            if symmetric && rows != cols {
                return Err(malformed(
                    n,
                    format!("a symmetric matrix must be square, not {rows} x {cols}"),
                ));
            }
            if rows.max(cols) > u32::MAX as u64 {
                return Err(malformed(n, "more vertices than 32-bit ids can name"));
            }
            size = Some((rows, cols));
            continue;
        };
        let width = if field == Field::Pattern { 2 } else { 3 };
        if words.len() != width {
            return Err(malformed(
                n,
                format!("expected {width} fields per entry, found {}", words.len()),
            ));
        }
        let i = number(n, words[0], "row")?;
        let j = number(n, words[1], "column")?;
        match field {
            Field::Pattern => {}
            Field::Integer => {
                words[2]
                    .parse::<i64>()
                    .map_err(|_| malformed(n, format!("value `{}` is not an integer", words[2])))?;
            }
            Field::Real => {
                words[2]
                    .parse::<f64>()
                    .map_err(|_| malformed(n, format!("value `{}` is not a number", words[2])))?;
            }
        }
        for (v, bound) in [(i, rows), (j, cols)] {
            if v == 0 || v > bound {
                return Err(MtxError::OutOfRange {
                    line: n,
                    vertex: v,
                    vertices: bound,
                });
            }
        }
        entries += 1;
        if entries > expected {
            return Err(malformed(
                n,
                format!("more entries than the {expected} the size line declares"),
            ));
        }
        let (s, t) = ((i - 1) as u32, (j - 1) as u32);
        edges.push((s, t));
        if symmetric && s != t {
            edges.push((t, s));
        }
    }
    let Some((rows, cols)) = size else {
        return Err(malformed(1, "no size line after the banner"));
    };
    if entries < expected {
        return Err(malformed(
            last_line,
            format!("the file ends after {entries} of {expected} entries"),
        ));
    }
    if rows.max(cols) == 0 || edges.is_empty() {
        return Err(MtxError::Empty);
    }
    Ok(EdgeList {
        vertices: rows.max(cols) as u32,
        edges,
    })
}

/// Reads a graph from a `.mtx` file.
pub fn read_file(path: &std::path::Path) -> Result<EdgeList, MtxError> {
    let file = std::fs::File::open(path).map_err(MtxError::Io)?;
    read(std::io::BufReader::new(file))
}
