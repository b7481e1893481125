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

/// The names of the `.visible` (exported) declarations of a PTX text.
fn visible(ptx: &str) -> Vec<&str> {
    ptx.lines()
        .filter(|line| line.trim_start().starts_with(".visible"))
        .filter_map(|line| line.split_whitespace().last())
        .map(|name| name.trim_end_matches(['(', ';']))
        .collect()
}

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
    assert_eq!(exported, USER_KERNELS);
}

#[test]
fn c_abi_ptx_holds_only_the_two_c_functions() {
    assert_eq!(entries(DEVICE_C_ABI_PTX), Vec::<&str>::new());
    let mut exported = visible(DEVICE_C_ABI_PTX);
    exported.sort_unstable();
    assert_eq!(exported, ["gallatin_free", "gallatin_malloc"]);
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
    assert_eq!(exported, kernels, "only the kernels are exported");
    let host = entries(gpumalloc::PTX);
    for kernel in [
        "heap_flush",
        "heap_grow",
        "heap_trim",
        "heap_adopt_run",
        "heap_take_request",
        "heap_answer_request",
    ] {
        assert!(
            !host.contains(&kernel),
            "{kernel} is a heap kernel: it belongs in heap-kernels only"
        );
    }
}
