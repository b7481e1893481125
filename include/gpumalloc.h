/*
 * gpumalloc.h: gpumalloc for C and CUDA C++.
 *
 * Two halves:
 *
 * - Device side (CUDA C++ only): `gallatin_malloc` / `gallatin_free`, the
 *   allocator's `extern "C"` device functions, exported from the PTX of the
 *   `device-c-abi` crate (device_c_abi.ptx, nothing else in it). A kernel receives the heap handle
 *   `gm_heap` by value and passes its address:
 *
 *       __global__ void k(gm_heap heap) {
 *           void *p = gallatin_malloc(&heap, 48);   // NULL if it cannot
 *           ...
 *           gallatin_free(&heap, p);
 *       }
 *
 *   (A `gm_heap` copied to device memory works as well: any generic
 *   address of the 160 bytes.) Link with relocatable device code; see the
 *   README, "Linking from CUDA C++", and examples/cpp/.
 *
 * - Host side (C, C++): libgpumalloc.so (crate `capi`) creates a heap in a
 *   device's memory, hands out its `gm_heap`, reads its statistics, and
 *   destroys it. It uses the device's primary context, the one the CUDA
 *   runtime uses, so the handle works in kernels launched with `<<<>>>`.
 *   Every call returns a `gm_status`; on failure the thread's last error
 *   (`gm_heap_last_error`) says what failed, naming the CUDA driver call
 *   where one did. No call aborts the process.
 *
 * The layout of `gm_heap` is the Rust `gpu_kernel::Heap`, field for field.
 * The static asserts below check the header against the numbers it states;
 * the `capi` crate checks those numbers against the Rust struct when it is
 * built, and compiles this header with the system C compiler in its tests.
 * Never write to a `gm_heap`: its fields are the allocator's business.
 */
#ifndef GPUMALLOC_H
#define GPUMALLOC_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
#define GM_STATIC_ASSERT(cond, msg) static_assert(cond, msg)
#define GM_ALIGNOF(type) alignof(type)
extern "C" {
#else
#define GM_STATIC_ASSERT(cond, msg) _Static_assert(cond, msg)
#define GM_ALIGNOF(type) _Alignof(type)
#endif

/* sizeof(gm_heap): the Rust `Heap`'s size. */
#define GM_HEAP_BYTES 160
/* Size classes (16 B ... 16 MiB): the length of `live_per_class`. */
#define GM_CLASSES 21
/* Levels a tree of segment ids may have. */
#define GM_TREE_MAX_LEVELS 4
/* sizeof(gm_heap_stats). */
#define GM_HEAP_STATS_BYTES 256

/* Shape of the heap's trees (`gpu_kernel::veb::TreeShape`). */
typedef struct gm_tree_shape {
    uint32_t universe;
    uint32_t levels;
    uint32_t level_start[GM_TREE_MAX_LEVELS];
    uint32_t level_words[GM_TREE_MAX_LEVELS];
    uint32_t words;
    uint32_t _pad;
} gm_tree_shape;

/* The device heap handle (`gpu_kernel::Heap`): addresses and word offsets.
 * Pass it by value to kernels; its memory is owned by the gm_device_heap
 * it came from. */
typedef struct gm_heap {
    uint64_t data;           /* address of segment 0 */
    uint64_t metadata;       /* address of metadata word 0 */
    uint64_t metadata_words;
    uint32_t segments;
    uint32_t flags;          /* GM_HEAP_CHECKED | GM_HEAP_TRAP_ON_MISUSE | no-spares (4) */
    uint32_t segment_shift;  /* log2 of the segment size (21..24) */
    uint32_t budget_segments; /* segments the slot and spare budgets count */
    uint64_t stats_at;       /* word offsets into the metadata, from here on */
    uint64_t slots_at;
    uint64_t locks_at;
    uint64_t spares_at;
    uint64_t states_at;
    uint64_t bitmaps_at;
    uint64_t counters_at;
    uint64_t trees_at;
    uint64_t slice_bits_at;
    gm_tree_shape tree;
} gm_heap;

/* One assert per field: offset and size as in the Rust struct. The
 * numbers are read back by the capi crate's build (keep one per line). */
#define GM_CHECK_FIELD(field, offset, size)                                  \
    GM_STATIC_ASSERT(offsetof(gm_heap, field) == (offset) &&                 \
                         sizeof(((gm_heap *)0)->field) == (size),            \
                     "gm_heap." #field " differs from the Rust Heap")
#define GM_CHECK_TREE_FIELD(field, offset, size)                             \
    GM_STATIC_ASSERT(offsetof(gm_heap, tree) +                               \
                                 offsetof(gm_tree_shape, field) ==           \
                             (offset) &&                                     \
                         sizeof(((gm_tree_shape *)0)->field) == (size),      \
                     "gm_heap.tree." #field " differs from the Rust Heap")

GM_STATIC_ASSERT(sizeof(gm_heap) == GM_HEAP_BYTES, "gm_heap size differs from the Rust Heap");
GM_STATIC_ASSERT(GM_ALIGNOF(gm_heap) == 8, "gm_heap alignment differs from the Rust Heap");
GM_CHECK_FIELD(data, 0, 8);
GM_CHECK_FIELD(metadata, 8, 8);
GM_CHECK_FIELD(metadata_words, 16, 8);
GM_CHECK_FIELD(segments, 24, 4);
GM_CHECK_FIELD(flags, 28, 4);
GM_CHECK_FIELD(segment_shift, 32, 4);
GM_CHECK_FIELD(budget_segments, 36, 4);
GM_CHECK_FIELD(stats_at, 40, 8);
GM_CHECK_FIELD(slots_at, 48, 8);
GM_CHECK_FIELD(locks_at, 56, 8);
GM_CHECK_FIELD(spares_at, 64, 8);
GM_CHECK_FIELD(states_at, 72, 8);
GM_CHECK_FIELD(bitmaps_at, 80, 8);
GM_CHECK_FIELD(counters_at, 88, 8);
GM_CHECK_FIELD(trees_at, 96, 8);
GM_CHECK_FIELD(slice_bits_at, 104, 8);
GM_CHECK_TREE_FIELD(universe, 112, 4);
GM_CHECK_TREE_FIELD(levels, 116, 4);
GM_CHECK_TREE_FIELD(level_start, 120, 16);
GM_CHECK_TREE_FIELD(level_words, 136, 16);
GM_CHECK_TREE_FIELD(words, 152, 4);
GM_CHECK_TREE_FIELD(_pad, 156, 4);

/* ---- device side ------------------------------------------------------ */

#if defined(__CUDACC__)
/* Allocates `size` bytes from `heap` (16-byte aligned at least; blocks and
 * runs aligned to their size). NULL when the heap cannot serve the request
 * or `size` is 0. Any thread, any time while the heap lives. */
__device__ void *gallatin_malloc(const gm_heap *heap, uint64_t size);

/* Frees `p` (from gallatin_malloc on the same heap) into `heap`. NULL does
 * nothing; a bad pointer is counted (see gm_heap_stats), or stops the kernel
 * on a heap created with GM_HEAP_TRAP_ON_MISUSE. */
__device__ void gallatin_free(const gm_heap *heap, void *p);
#endif

/* ---- host side: libgpumalloc.so ----------------------------------------- */

/* What a call answers. On anything but GM_OK, gm_heap_last_error has the
 * message. */
typedef enum gm_status {
    GM_OK = 0,
    GM_ERROR_INVALID_ARGUMENT = 1, /* a null pointer, a negative device, an unknown flag */
    GM_ERROR_HEAP_SIZE = 2,        /* the size cannot be laid out (0, under a segment, too large) */
    GM_ERROR_NO_DRIVER = 3,        /* libcuda cannot be loaded */
    GM_ERROR_NO_DEVICE = 4,        /* the driver reports no GPU */
    GM_ERROR_OUT_OF_MEMORY = 5,    /* the device has not that much free memory */
    GM_ERROR_CUDA = 6,             /* another driver call failed; the message names it */
    GM_ERROR_INTERNAL = 7,         /* a bug in gpumalloc (a Rust panic, caught) */
    GM_ERROR_LAYOUT = 8            /* the device code was built over another heap layout: rebuild it */
} gm_status;

/* Flags of gm_heap_create. 0: unchecked (bad frees counted, double frees of
 * slices not detected), as benchmarks run it. */
#define GM_HEAP_CHECKED 1u        /* one bit per slice: double frees detected (0.8% more memory) */
#define GM_HEAP_TRAP_ON_MISUSE 2u /* a wild or double free stops the kernel (after counting it) */

/* A heap in one device's memory (opaque; `host::DeviceHeap`). */
typedef struct gm_device_heap gm_device_heap;

/* What a heap holds, read while no kernel uses it. */
typedef struct gm_heap_stats {
    uint64_t heap_bytes;        /* bytes of data (whole segments) */
    uint64_t segment_bytes;     /* bytes per segment (chosen from the heap's size) */
    uint64_t segments;
    uint64_t free_segments;     /* segments in the segment tree */
    uint64_t live_bytes;        /* handed out and not freed, at class granularity */
    uint64_t live_allocations;  /* of every kind */
    uint64_t live_runs;         /* multi-segment allocations */
    uint64_t run_segments;      /* segments those hold */
    uint64_t failed_mallocs;    /* gallatin_malloc calls that answered NULL for size > 0 */
    uint64_t invalid_frees;     /* frees of pointers the heap never handed out */
    uint64_t double_frees;      /* detected double frees */
    uint64_t live_per_class[GM_CLASSES]; /* 16 B, 32 B, ... one segment */
} gm_heap_stats;

GM_STATIC_ASSERT(sizeof(gm_heap_stats) == GM_HEAP_STATS_BYTES,
                 "gm_heap_stats size differs from the Rust GmHeapStats");

/* Creates a heap of `bytes` (rounded down to whole segments of 2 ... 16 MiB,
 * chosen from the size) on CUDA device `device`, with GM_HEAP_* `flags`.
 * On GM_OK, *out is the heap; otherwise *out is NULL. Waits until the
 * heap's initial metadata is on the device. */
gm_status gm_heap_create(int device, uint64_t bytes, uint32_t flags, gm_device_heap **out);

/* Copies the heap's handle into *out, to pass to kernels. It is valid
 * until gm_heap_destroy. */
gm_status gm_heap_handle(const gm_device_heap *heap, gm_heap *out);

/* Waits for the heap's stream (the legacy default stream), then reads the
 * statistics into *out. Call it when no kernel uses the heap (after
 * cudaDeviceSynchronize, or after synchronising the kernels' stream). */
gm_status gm_heap_stats_get(const gm_device_heap *heap, gm_heap_stats *out);

/* Frees the heap's device memory. NULL does nothing. No kernel may still
 * use the heap, nor any pointer it handed out. */
void gm_heap_destroy(gm_device_heap *heap);

/* Copies this thread's last error message into `buf` (`len` bytes, NUL
 * terminated, cut to fit; `buf` may be NULL) and clears it. Returns the
 * message's full length (0: no error since the last call). */
size_t gm_heap_last_error(char *buf, size_t len);

/* This library's heap-layout fingerprint: a hash of the heap's layout
 * constants and GPUMALLOC_* build settings. Device code built from the
 * same gpumalloc source with the same settings carries the same value as
 * its global GPUMALLOC_LAYOUT_FINGERPRINT. */
uint64_t gm_layout_fingerprint(void);

/* GM_OK if `device_fingerprint` (read from the device code the program
 * linked) is this library's; otherwise GM_ERROR_LAYOUT, and the last error
 * says to rebuild: that device code would corrupt heaps this library lays
 * out. CUDA C++ programs call gm_check_device_layout() below instead. */
gm_status gm_layout_check(uint64_t device_fingerprint);

#ifdef __cplusplus
} /* extern "C" */
#endif

#if defined(__cplusplus) && defined(__CUDACC__)
/* CUDA C++ (relocatable device code, linked with device_c_abi.ptx): reads
 * the linked device code's fingerprint on the current device and checks it
 * with gm_layout_check. Call it once before the first kernel that uses a
 * heap; a stale device_c_abi.ptx is then refused instead of corrupting the
 * heap. Answers GM_ERROR_CUDA if a CUDA runtime call fails
 * (cudaGetLastError() then says which). Templates, so a program that
 * includes this header but never calls them needs no device_c_abi.ptx. */
extern __device__ uint64_t GPUMALLOC_LAYOUT_FINGERPRINT;

template <int Unused = 0>
__global__ void gm_read_layout_fingerprint(uint64_t *out) {
    *out = GPUMALLOC_LAYOUT_FINGERPRINT;
}

template <int Unused = 0>
inline gm_status gm_check_device_layout() {
    uint64_t *on_device = nullptr;
    uint64_t found = 0;
    if (cudaMalloc(&on_device, sizeof(uint64_t)) != cudaSuccess) {
        return GM_ERROR_CUDA;
    }
    gm_read_layout_fingerprint<Unused><<<1, 1>>>(on_device);
    /* Peek, not get: a failed launch stays the runtime's last error. */
    cudaError_t launched = cudaPeekAtLastError();
    cudaError_t copied = launched == cudaSuccess
        ? cudaMemcpy(&found, on_device, sizeof(uint64_t), cudaMemcpyDeviceToHost)
        : launched;
    cudaFree(on_device);
    if (copied != cudaSuccess) {
        return GM_ERROR_CUDA;
    }
    return gm_layout_check(found);
}
#endif

#endif /* GPUMALLOC_H */
