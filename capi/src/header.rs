//! Build-time check of `include/gpumalloc.h` against the Rust side: the
//! numbers the header states (`GM_HEAP_BYTES`, each `GM_CHECK_FIELD` /
//! `GM_CHECK_TREE_FIELD` line's offset and size, `GM_CLASSES`, the stats
//! size, the flags and status codes) are read from its text by `const fn`s
//! and compared with `gpu_kernel::c_layout` and this crate's types. A
//! mismatch stops the build with the name of what differs. The header's own
//! static asserts hold the C struct to those numbers whenever a C or CUDA
//! compiler reads it; `tests/header.rs` compiles it with the system `cc`.
//! Nothing here runs at run time.

use gpu_kernel::c_layout::{HEAP_ALIGN, HEAP_BYTES, HEAP_FIELDS};
use gpu_kernel::class::CLASSES;
use gpu_kernel::veb::MAX_LEVELS;

use crate::{GmHeapStats, GmStatus, HEAP_CHECKED, HEAP_TRAP_ON_MISUSE};

/// The header's text, as compiled into this crate.
pub(crate) const HEADER: &str = include_str!("../../include/gpumalloc.h");

/// Whether `hay[at..]` starts with `needle`.
const fn starts_with(hay: &[u8], at: usize, needle: &[u8]) -> bool {
    if at + needle.len() > hay.len() {
        return false;
    }
    let mut i = 0;
    while i < needle.len() {
        if hay[at + i] != needle[i] {
            return false;
        }
        i += 1;
    }
    true
}

const fn is_ident(c: u8) -> bool {
    c.is_ascii_alphanumeric() || c == b'_'
}

/// The decimal number at `hay[at..]` and the index past it, or `None`.
const fn number(hay: &[u8], mut at: usize) -> Option<(usize, usize)> {
    let start = at;
    let mut n = 0;
    while at < hay.len() && hay[at].is_ascii_digit() {
        n = n * 10 + (hay[at] - b'0') as usize;
        at += 1;
    }
    if at == start { None } else { Some((n, at)) }
}

/// Index past the spaces at `hay[at..]`.
const fn skip_spaces(hay: &[u8], mut at: usize) -> usize {
    while at < hay.len() && hay[at] == b' ' {
        at += 1;
    }
    at
}

/// The number that follows the whole word `name` somewhere in the header
/// (`#define NAME 160`, `NAME = 3,`, `NAME 1u`); occurrences followed by
/// anything else (comments, uses) are passed over. Stops the build if
/// there is none.
pub(crate) const fn value_of(name: &str) -> usize {
    let hay = HEADER.as_bytes();
    let name = name.as_bytes();
    let mut at = 0;
    while at < hay.len() {
        if starts_with(hay, at, name)
            && (at == 0 || !is_ident(hay[at - 1]))
            && at + name.len() < hay.len()
            && !is_ident(hay[at + name.len()])
        {
            let mut p = skip_spaces(hay, at + name.len());
            if p < hay.len() && hay[p] == b'=' {
                p = skip_spaces(hay, p + 1);
            }
            if let Some((n, _)) = number(hay, p) {
                return n;
            }
        }
        at += 1;
    }
    panic!("a name the capi crate checks has no value in include/gpumalloc.h")
}

/// Whether `name` (a C designator of `gm_heap`) is `prefix` + `hay[at..end]`.
const fn same_name(name: &str, prefix: &[u8], hay: &[u8], at: usize, end: usize) -> bool {
    let name = name.as_bytes();
    name.len() == prefix.len() + (end - at) && starts_with(name, 0, prefix) && {
        let mut i = 0;
        while i < end - at && name[prefix.len() + i] == hay[at + i] {
            i += 1;
        }
        i == end - at
    }
}

/// Checks every `GM_CHECK_FIELD(name, offset, size)` and
/// `GM_CHECK_TREE_FIELD(…)` line of the header, in order, against
/// [`HEAP_FIELDS`]: same names, offsets, sizes, and as many. Answers the
/// index of the first field that differs, or `None`.
const fn first_field_that_differs() -> Option<usize> {
    const PLAIN: &[u8] = b"GM_CHECK_FIELD(";
    const TREE: &[u8] = b"GM_CHECK_TREE_FIELD(";
    let hay = HEADER.as_bytes();
    let mut field = 0;
    let mut at = 0;
    while at < hay.len() {
        let (macro_len, prefix): (usize, &[u8]) = if starts_with(hay, at, PLAIN) {
            (PLAIN.len(), b"")
        } else if starts_with(hay, at, TREE) {
            (TREE.len(), b"tree.")
        } else {
            at += 1;
            continue;
        };
        // The macros' own definitions are not checks.
        if at >= 8 && starts_with(hay, at - 8, b"#define ") {
            at += macro_len;
            continue;
        }
        if field == HEAP_FIELDS.len() {
            return Some(field);
        }
        let name_at = at + macro_len;
        let mut name_end = name_at;
        while name_end < hay.len() && is_ident(hay[name_end]) {
            name_end += 1;
        }
        let f = &HEAP_FIELDS[field];
        if !same_name(f.name, prefix, hay, name_at, name_end) {
            return Some(field);
        }
        // `, offset, size)`
        let p = skip_spaces(hay, name_end + 1);
        let Some((offset, p)) = number(hay, p) else {
            return Some(field);
        };
        let p = skip_spaces(hay, p + 1);
        let Some((size, p)) = number(hay, p) else {
            return Some(field);
        };
        if offset != f.offset || size != f.size || hay[p] != b')' {
            return Some(field);
        }
        field += 1;
        at = p;
    }
    if field == HEAP_FIELDS.len() {
        None
    } else {
        Some(field)
    }
}

const _: () = assert!(
    value_of("GM_HEAP_BYTES") == HEAP_BYTES && HEAP_ALIGN == 8,
    "include/gpumalloc.h: GM_HEAP_BYTES is not size_of::<gpu_kernel::Heap>()"
);
const _: () = assert!(
    first_field_that_differs().is_none(),
    "include/gpumalloc.h: a GM_CHECK_FIELD line differs from gpu_kernel::c_layout::HEAP_FIELDS \
     (first_field_that_differs() gives its index)"
);
const _: () = assert!(
    value_of("GM_CLASSES") == CLASSES as usize,
    "include/gpumalloc.h: GM_CLASSES is not gpu_kernel::class::CLASSES"
);
const _: () = assert!(
    value_of("GM_TREE_MAX_LEVELS") == MAX_LEVELS,
    "include/gpumalloc.h: GM_TREE_MAX_LEVELS is not gpu_kernel::veb::MAX_LEVELS"
);
const _: () = assert!(
    value_of("GM_HEAP_STATS_BYTES") == size_of::<GmHeapStats>(),
    "include/gpumalloc.h: GM_HEAP_STATS_BYTES is not size_of::<GmHeapStats>()"
);
const _: () = assert!(
    value_of("GM_HEAP_CHECKED") == HEAP_CHECKED as usize
        && value_of("GM_HEAP_TRAP_ON_MISUSE") == HEAP_TRAP_ON_MISUSE as usize,
    "include/gpumalloc.h: the GM_HEAP_* flags differ from the capi crate's"
);
const _: () = assert!(
    value_of("GM_OK") == GmStatus::Ok as usize
        && value_of("GM_ERROR_INVALID_ARGUMENT") == GmStatus::InvalidArgument as usize
        && value_of("GM_ERROR_HEAP_SIZE") == GmStatus::HeapSize as usize
        && value_of("GM_ERROR_NO_DRIVER") == GmStatus::NoDriver as usize
        && value_of("GM_ERROR_NO_DEVICE") == GmStatus::NoDevice as usize
        && value_of("GM_ERROR_OUT_OF_MEMORY") == GmStatus::OutOfMemory as usize
        && value_of("GM_ERROR_CUDA") == GmStatus::Cuda as usize
        && value_of("GM_ERROR_INTERNAL") == GmStatus::Internal as usize
        && value_of("GM_ERROR_LAYOUT") == GmStatus::Layout as usize,
    "include/gpumalloc.h: a gm_status value differs from GmStatus"
);
const _: () = assert!(
    size_of::<gpu_kernel::layout::HeapImage>() == HEAP_BYTES,
    "gm_heap_handle writes a HeapImage where C has a gm_heap"
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn values_are_read_from_the_header() {
        assert_eq!(value_of("GM_HEAP_BYTES"), HEAP_BYTES);
        assert_eq!(value_of("GM_ERROR_INTERNAL"), 7);
        assert_eq!(first_field_that_differs(), None);
    }
}
