//! A user's kernel crate gets only its own kernels in its PTX (issue 17).
//!
//! `examples/user-kernel` depends on the allocator crate `gpu-kernel` and is
//! compiled to PTX by the root `build.rs` with `ptx_builder`, as a user's own
//! build script would. Its `.entry` lines must be exactly the kernels it
//! writes, and it must export no other global symbol (the allocator's
//! `gallatin_*` functions included). The PTX CUDA C++ links
//! (`device-c-abi`) holds `gallatin_malloc` and `gallatin_free` and no
//! kernel. The heap kernels' PTX (`host::gpu::HEAP_KERNELS_PTX`, from
//! `heap-kernels`) holds exactly the kernels a heap launches on itself, and
//! the host's PTX (`gpumalloc::PTX`, from `gpu-kernels`) the benchmark and
//! test kernels the `gpumalloc` program launches by name.

/// The PTX of `examples/user-kernel`.
const USER_PTX: &str = include_str!(env!("GPUMALLOC_USER_KERNEL_PTX_PATH"));

/// The PTX CUDA C++ links (`device-c-abi`).
const DEVICE_C_ABI_PTX: &str = include_str!(env!("GPUMALLOC_DEVICE_C_ABI_PTX_PATH"));

/// The names of the `.entry` (kernel) declarations of a PTX text.
fn entries(ptx: &str) -> Vec<&str> {
    ptx.lines()
        .filter_map(|line| line.split_once(".entry ").map(|(_, rest)| rest))
        .map(|rest| rest.split(['(', ' ']).next().unwrap_or(rest).trim())
        .collect()
}

/// The names of the `.visible` (exported) declarations of a PTX text:
/// functions and kernels (the last word of the line), and globals (the
/// word before `[` or ` =`).
fn visible(ptx: &str) -> Vec<&str> {
    ptx.lines()
        .filter(|line| line.trim_start().starts_with(".visible"))
        .filter_map(|line| match line.split_once(" .global ") {
            Some((_, rest)) => rest
                .split(" =")
                .next()
                .and_then(|decl| decl.split_whitespace().last())
                .map(|name| name.split('[').next().unwrap_or(name)),
            None => line.split_whitespace().last(),
        })
        .map(|name| name.trim_end_matches(['(', ';']))
        .collect()
}

/// The layout fingerprint a PTX text carries (`gpu_kernel::fingerprint`):
/// the eight bytes of its `GPUMALLOC_LAYOUT_FINGERPRINT` global, little
/// endian.
fn fingerprint(ptx: &str) -> Option<u64> {
    let line = ptx
        .lines()
        .find(|line| line.contains(" .global ") && line.contains("GPUMALLOC_LAYOUT_FINGERPRINT"))?;
    let (_, values) = line.split_once('{')?;
    let bytes: Vec<u8> = values
        .trim_end_matches(['}', ';'])
        .split(',')
        .map(|b| b.trim().parse().ok())
        .collect::<Option<_>>()?;
    Some(u64::from_le_bytes(bytes.try_into().ok()?))
}

/// Every PTX built over the allocator carries this build's fingerprint, so
/// `Gpu::open` accepts it and refuses a stale one.
#[test]
fn every_ptx_carries_the_hosts_layout_fingerprint() {
    let ours = gpumalloc::gpu_kernel::fingerprint::LAYOUT_FINGERPRINT;
    for (name, ptx) in [
        ("user_kernel.ptx", USER_PTX),
        ("device_c_abi.ptx", DEVICE_C_ABI_PTX),
        ("gpumalloc::PTX", gpumalloc::PTX),
        ("heap_kernels.ptx", host::gpu::HEAP_KERNELS_PTX),
    ] {
        assert_eq!(fingerprint(ptx), Some(ours), "{name}");
    }
    assert_eq!(
        fingerprint(
            ".visible .global .align 8 .b8 GPUMALLOC_LAYOUT_FINGERPRINT[8] = {1, 0, 0, 0, 0, 0, 0, 2};"
        ),
        Some(1 | 2 << 56)
    );
}

/// The global every PTX over the allocator exports besides its functions.
const FINGERPRINT: &str = "GPUMALLOC_LAYOUT_FINGERPRINT";

/// The kernels `examples/user-kernel` writes (for examples 01, 02 and 04),
/// sorted.
const USER_KERNELS: [&str; 4] = [
    "user_first_alloc",
    "user_grow_check_free",
    "user_grow_fill",
    "user_list_sum",
];

#[test]
fn user_ptx_holds_only_the_users_kernels() {
    let mut kernels = entries(USER_PTX);
    kernels.sort_unstable();
    assert_eq!(kernels, USER_KERNELS);
    let mut exported = visible(USER_PTX);
    exported.sort_unstable();
    let mut expected = USER_KERNELS.to_vec();
    expected.insert(0, FINGERPRINT);
    assert_eq!(exported, expected);
}

#[test]
fn c_abi_ptx_holds_only_the_two_c_functions() {
    assert_eq!(entries(DEVICE_C_ABI_PTX), Vec::<&str>::new());
    let mut exported = visible(DEVICE_C_ABI_PTX);
    exported.sort_unstable();
    assert_eq!(exported, [FINGERPRINT, "gallatin_free", "gallatin_malloc"]);
}

#[test]
fn host_ptx_holds_the_kernels_the_host_launches() {
    let host = entries(gpumalloc::PTX);
    for kernel in [
        "heap_alloc",
        "heap_free",
        "gpumalloc_selftest",
        "graph_degrees",
    ] {
        assert!(
            host.contains(&kernel),
            "{kernel} missing from gpumalloc::PTX"
        );
    }
    for kernel in USER_KERNELS {
        assert!(!host.contains(&kernel), "{kernel} in gpumalloc::PTX");
    }
    let exported = visible(gpumalloc::PTX);
    for function in ["gallatin_malloc", "gallatin_free"] {
        assert!(
            exported.contains(&function),
            "{function} missing from gpumalloc::PTX"
        );
    }
}

#[test]
fn entry_lines_are_parsed() {
    let ptx =
        ".visible .entry a(\n\t.param .u64 x\n)\n.visible .func  (.param .b64 r) f(\n.entry b (\n";
    assert_eq!(entries(ptx), ["a", "b"]);
    assert_eq!(visible(ptx), ["a", "f"]);
    let global = ".visible .global .align 8 .b8 G[8] = {1, 2, 3, 4, 5, 6, 7, 8};\n.visible .global .align 4 .u32 h;";
    assert_eq!(visible(global), ["G", "h"]);
}

#[test]
fn heap_kernels_ptx_holds_only_the_heap_kernels() {
    let mut kernels = entries(host::gpu::HEAP_KERNELS_PTX);
    kernels.sort_unstable();
    assert_eq!(
        kernels,
        [
            "heap_adopt_run",
            "heap_answer_request",
            "heap_flush",
            "heap_free",
            "heap_grow",
            "heap_take_request",
            "heap_trim"
        ]
    );
    let mut exported = visible(host::gpu::HEAP_KERNELS_PTX);
    exported.sort_unstable();
    kernels.insert(0, FINGERPRINT);
    assert_eq!(
        exported, kernels,
        "only the kernels (and the fingerprint) are exported"
    );
    let host = entries(gpumalloc::PTX);
    // `heap_free` is also a bench kernel of the host's PTX.
    for kernel in host::gpu::HEAP_KERNELS
        .iter()
        .filter(|&&k| k != "heap_free")
    {
        assert!(
            !host.contains(kernel),
            "{kernel} is a heap kernel: it belongs in heap-kernels only"
        );
    }
}

/// The check `Gpu::open` makes: equal fingerprints pass; others give an
/// error naming both and what to do.
#[test]
fn a_different_fingerprint_is_an_error_that_says_what_to_do() {
    assert!(host::gpu::check_layout_fingerprint(7, 7, "x.ptx").is_ok());
    let text = host::gpu::check_layout_fingerprint(1, 2, "x.ptx")
        .unwrap_err()
        .to_string();
    for part in [
        "x.ptx",
        "0x0000000000000001",
        "0x0000000000000002",
        "Rebuild",
    ] {
        assert!(text.contains(part), "{part}: {text}");
    }
}
