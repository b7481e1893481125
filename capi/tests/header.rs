//! `include/gpumalloc.h` through a real C compiler: a small C program
//! includes the header and prints `sizeof`/`offsetof` of every field of
//! `gm_heap` and `gm_heap_stats`; the numbers must be the Rust ones
//! (`gpu_kernel::c_layout::HEAP_FIELDS`, `offset_of!` on `GmHeapStats`).
//! The header also goes through the C++ compiler (its static asserts in
//! C++ mode). Without a C compiler (`$CC`, else `cc`) each test prints
//! `skipped: no C compiler (…)` and passes; the build-time check of the
//! `header` module still holds.

use std::mem::{offset_of, size_of};
use std::path::{Path, PathBuf};
use std::process::Command;

use gpu_kernel::c_layout::{HEAP_BYTES, HEAP_FIELDS};
use gpumalloc_c::GmHeapStats;

/// `(name, offset, size)` of every field of `GmHeapStats`, in order.
fn stats_fields() -> Vec<(&'static str, usize, usize)> {
    macro_rules! fields {
        ($($f:ident),+) => {
            vec![$((
                stringify!($f),
                offset_of!(GmHeapStats, $f),
                std::mem::size_of_val(&GmHeapStats::default().$f),
            )),+]
        };
    }
    fields!(
        heap_bytes,
        segment_bytes,
        segments,
        free_segments,
        live_bytes,
        live_allocations,
        live_runs,
        run_segments,
        failed_mallocs,
        invalid_frees,
        double_frees,
        live_per_class
    )
}

fn include_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../include")
}

/// A scratch directory of this test run.
fn scratch(name: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("gpumalloc-capi-{}-{name}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir is writable");
    dir
}

/// The compiler named by `env` (default `default`) if it runs, or `None`
/// after printing why the test is skipped.
fn compiler(env: &str, default: &str) -> Option<String> {
    let cc = std::env::var(env).unwrap_or_else(|_| default.to_string());
    match Command::new(&cc).arg("--version").output() {
        Ok(out) if out.status.success() => Some(cc),
        Ok(out) => {
            println!(
                "skipped: no C compiler ({cc} --version exited with {})",
                out.status
            );
            None
        }
        Err(e) => {
            println!("skipped: no C compiler ({cc}: {e}; set {env} to one)");
            None
        }
    }
}

/// Compiles `source` with `cc` and `flags` (and `libs` after the source)
/// into `dir/prog` (an object with `-c`), failing the
/// test with the compiler's output if it does not compile.
fn compile(
    cc: &str,
    flags: &[&str],
    libs: &[&str],
    dir: &Path,
    file: &str,
    source: &str,
) -> PathBuf {
    let src = dir.join(file);
    std::fs::write(&src, source).unwrap();
    let exe = dir.join("prog");
    let out = Command::new(cc)
        .args(flags)
        .arg("-I")
        .arg(include_dir())
        .arg(&src)
        .args(libs)
        .arg("-o")
        .arg(&exe)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{cc} rejects include/gpumalloc.h ({file}):\n{}",
        String::from_utf8_lossy(&out.stderr)
    );
    exe
}

#[test]
fn c_compiler_lays_out_gm_heap_and_gm_heap_stats_as_rust_does() {
    let Some(cc) = compiler("CC", "cc") else {
        return;
    };
    let mut program = String::from(
        "#include <stdio.h>\n#include \"gpumalloc.h\"\n\
         #define F(T, f) printf(#T \" \" #f \" %zu %zu\\n\", offsetof(T, f), sizeof(((T *)0)->f));\n\
         int main(void) {\n\
         printf(\"sizeof gm_heap %zu\\n\", sizeof(gm_heap));\n\
         printf(\"sizeof gm_heap_stats %zu\\n\", sizeof(gm_heap_stats));\n",
    );
    let mut expected = format!(
        "sizeof gm_heap {HEAP_BYTES}\nsizeof gm_heap_stats {}\n",
        size_of::<GmHeapStats>()
    );
    for f in HEAP_FIELDS {
        program += &format!("F(gm_heap, {})\n", f.name);
        expected += &format!("gm_heap {} {} {}\n", f.name, f.offset, f.size);
    }
    for (name, offset, size) in stats_fields() {
        program += &format!("F(gm_heap_stats, {name})\n");
        expected += &format!("gm_heap_stats {name} {offset} {size}\n");
    }
    program += "return 0;\n}\n";
    let dir = scratch("layout");
    let exe = compile(
        &cc,
        &["-std=c11", "-Wall", "-Werror"],
        &[],
        &dir,
        "layout.c",
        &program,
    );
    let out = Command::new(&exe).output().unwrap();
    assert!(out.status.success());
    let printed = String::from_utf8(out.stdout).unwrap();
    for (c, rust) in printed.lines().zip(expected.lines()) {
        assert_eq!(c, rust, "C (left) and Rust (right) disagree");
    }
    assert_eq!(printed.lines().count(), expected.lines().count());
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn the_header_is_valid_cpp_and_declares_the_host_api() {
    let Some(cxx) = compiler("CXX", "c++") else {
        return;
    };
    // The declarations must match the Rust signatures' C types: taking
    // each function's address as the exact pointer type checks them.
    let program = "#include \"gpumalloc.h\"\n\
        int main() {\n\
        gm_status (*create)(int, uint64_t, uint32_t, gm_device_heap **) = gm_heap_create;\n\
        gm_status (*handle)(const gm_device_heap *, gm_heap *) = gm_heap_handle;\n\
        gm_status (*stats)(const gm_device_heap *, gm_heap_stats *) = gm_heap_stats_get;\n\
        void (*destroy)(gm_device_heap *) = gm_heap_destroy;\n\
        size_t (*last)(char *, size_t) = gm_heap_last_error;\n\
        return (create && handle && stats && destroy && last) ? 0 : 1;\n\
        }\n";
    let dir = scratch("cxx");
    // Compile only (-c): the C test below links the library.
    compile(
        &cxx,
        &["-std=c++11", "-Wall", "-Werror", "-c"],
        &[],
        &dir,
        "api.cpp",
        program,
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// The library exports every function the header declares, under the
/// header's names (the symbols of the rlib's extern functions).
#[test]
fn the_header_declares_what_the_library_defines() {
    let header = std::fs::read_to_string(include_dir().join("gpumalloc.h")).unwrap();
    for f in [
        "gm_heap_create(",
        "gm_heap_handle(",
        "gm_heap_stats_get(",
        "gm_heap_destroy(",
        "gm_heap_last_error(",
    ] {
        assert!(header.contains(f), "the header lacks {f}");
    }
    // The Rust signatures, in the C types of the header's declarations
    // (checked by the C++ test above): a renamed or retyped function fails
    // to compile here.
    use gpu_kernel::layout::HeapImage;
    use gpumalloc_c::{GmDeviceHeap, GmStatus};
    use std::ffi::{c_char, c_int};
    let _: unsafe extern "C" fn(c_int, u64, u32, *mut *mut GmDeviceHeap) -> GmStatus =
        gpumalloc_c::gm_heap_create;
    let _: unsafe extern "C" fn(*const GmDeviceHeap, *mut HeapImage) -> GmStatus =
        gpumalloc_c::gm_heap_handle;
    let _: unsafe extern "C" fn(*const GmDeviceHeap, *mut GmHeapStats) -> GmStatus =
        gpumalloc_c::gm_heap_stats_get;
    let _: unsafe extern "C" fn(*mut GmDeviceHeap) = gpumalloc_c::gm_heap_destroy;
    let _: unsafe extern "C" fn(*mut c_char, usize) -> usize = gpumalloc_c::gm_heap_last_error;
}

/// A C program built with the header and linked against the library cargo
/// built for this test (`deps/libgpumalloc_c.so`, beside the test binary)
/// calls the API as a C user would: bad arguments answer their status and
/// message, a heap is created where there is a GPU and `GM_ERROR_NO_DRIVER`
/// or `GM_ERROR_NO_DEVICE` is answered where there is none.
#[test]
fn a_c_program_links_the_library_and_reads_its_answers() {
    let Some(cc) = compiler("CC", "cc") else {
        return;
    };
    let exe = std::env::current_exe().unwrap();
    let deps = exe.parent().unwrap();
    if !deps.join("libgpumalloc_c.so").exists() {
        println!("skipped: no libgpumalloc_c.so beside {}", exe.display());
        return;
    }
    let program = r#"
#include <stdio.h>
#include <string.h>
#include "gpumalloc.h"

static int fails = 0;
static void expect(const char *what, gm_status got, gm_status want, const char *in_message) {
    char msg[512];
    size_t n = gm_heap_last_error(msg, sizeof msg);
    if (got != want || (in_message && (n == 0 || !strstr(msg, in_message)))) {
        printf("FAIL %s: status %d (want %d), message \"%s\"\n", what, got, want, n ? msg : "");
        fails++;
    }
}

int main(void) {
    gm_device_heap *h = (gm_device_heap *)&fails;
    expect("size 0", gm_heap_create(0, 0, 0, &h), GM_ERROR_HEAP_SIZE, "a heap of 0 bytes");
    if (h != NULL) { printf("FAIL: *out not NULL after a failure\n"); fails++; }
    expect("1 MiB", gm_heap_create(0, 1u << 20, 0, &h), GM_ERROR_HEAP_SIZE, "smaller than one segment");
    expect("device -1", gm_heap_create(-1, 1u << 30, 0, &h), GM_ERROR_INVALID_ARGUMENT, "negative device");
    expect("flag 8", gm_heap_create(0, 1u << 30, 8, &h), GM_ERROR_INVALID_ARGUMENT, "unknown flags 0x8");
    expect("null out", gm_heap_create(0, 1u << 30, 0, NULL), GM_ERROR_INVALID_ARGUMENT, "null output");
    gm_heap_stats s;
    expect("stats of NULL", gm_heap_stats_get(NULL, &s), GM_ERROR_INVALID_ARGUMENT, "null heap");
    gm_heap handle;
    expect("handle of NULL", gm_heap_handle(NULL, &handle), GM_ERROR_INVALID_ARGUMENT, "null heap");
    gm_heap_destroy(NULL);
    gm_status st = gm_heap_create(0, 64u << 20, GM_HEAP_CHECKED, &h);
    if (st == GM_OK) {
        expect("handle", gm_heap_handle(h, &handle), GM_OK, NULL);
        expect("stats", gm_heap_stats_get(h, &s), GM_OK, NULL);
        if (s.live_allocations != 0 || s.segments != handle.segments || handle.data == 0) {
            printf("FAIL: a new heap's statistics or handle\n");
            fails++;
        }
        gm_heap_destroy(h);
        printf("gpu\n");
    } else {
        expect("no GPU", st, st == GM_ERROR_NO_DEVICE ? GM_ERROR_NO_DEVICE : GM_ERROR_NO_DRIVER,
               "gm_heap_create(device 0, 67108864 bytes, flags 0x1): ");
        printf("no gpu\n");
    }
    printf(fails ? "FAILED\n" : "ok\n");
    return fails != 0;
}
"#;
    let dir = scratch("link");
    let rpath = format!("-Wl,-rpath,{}", deps.display());
    let lib_dir = format!("-L{}", deps.display());
    let exe = compile(
        &cc,
        &["-std=c11", "-Wall", "-Werror", &lib_dir, &rpath],
        &["-lgpumalloc_c"],
        &dir,
        "link.c",
        program,
    );
    let out = Command::new(&exe).output().unwrap();
    let printed = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{printed}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(printed.ends_with("ok\n"), "{printed}");
    println!("{printed}");
    let _ = std::fs::remove_dir_all(dir);
}
