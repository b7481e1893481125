// 03_alloc_check.cu: example 03, a CUDA C++ program that allocates from a
// gpumalloc heap (examples 01, 02 and 04 are Rust: examples/*.rs).
//
// The host creates a heap with the C API (libgpumalloc_c.so) and passes its
// `gm_heap` by value to two kernels. In the first each thread allocates
// 16 B ... 2 KiB with gallatin_malloc and fills it with its own pattern; in
// the second each thread checks its block (a block shared with another
// thread would hold that thread's pattern) and frees it with gallatin_free.
// Before anything, it checks that the linked device code was built over
// the library's heap layout (gm_check_device_layout). The heap's statistics
// must show every allocation live between the two kernels and none after.
// Prints one line ending in PASS or FAIL (exit 1).
//
// Build (scripts/build-cpp-example.sh runs this; device_c_abi.ptx and
// libgpumalloc_c.so come from scripts/stage-gpu.sh into .gpu/):
//
//   nvcc -arch=sm_90 -rdc=true -I include -c examples/cpp/03_alloc_check.cu -o 03_alloc_check.o
//   nvcc -arch=sm_90 -dc .gpu/device_c_abi.ptx -o device_c_abi.o
//   nvcc -arch=sm_90 -dlink 03_alloc_check.o device_c_abi.o -o 03_alloc_check_dlink.o
//   nvcc -arch=sm_90 03_alloc_check.o device_c_abi.o 03_alloc_check_dlink.o -L .gpu -lgpumalloc_c \
//        -Xlinker -rpath -Xlinker "$PWD/.gpu" -o 03_alloc_check
//   ./03_alloc_check
//
// -rdc=true leaves the calls to gallatin_malloc/gallatin_free unresolved in
// 03_alloc_check.o; -dc compiles the allocator's PTX (ptxas) into an object
// with relocatable device code and its host-side registration; -dlink links
// the device code of both; the last line links the host side against the C
// API. (nvcc refuses a .ptx in a whole-program build, and `-dlink` given the
// .ptx itself leaves the registration undefined at the final link.) The
// last two steps can be one: nvcc -arch=sm_90 -rdc=true 03_alloc_check.o
// device_c_abi.o -L .gpu -lgpumalloc_c ... device-links on its own.

#include <cstdio>
#include <cstdlib>
#include <cuda_runtime.h>

#include "gpumalloc.h"

// Bytes thread t asks for: 16 B ... 2 KiB, every slice class but 4 KiB.
__host__ __device__ static uint64_t size_of_thread(uint64_t t) { return 16ull << (t % 8); }

// The word thread t writes at index i of its block.
__device__ static uint64_t pattern(uint64_t t, uint64_t i) {
    return (t << 20) ^ i ^ 0x9e3779b97f4a7c15ull;
}

__global__ void alloc_and_fill(gm_heap heap, uint64_t **ptrs, uint64_t n,
                               unsigned long long *nulls) {
    uint64_t t = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
    if (t >= n) return;
    uint64_t bytes = size_of_thread(t);
    uint64_t *p = (uint64_t *)gallatin_malloc(&heap, bytes);
    ptrs[t] = p;
    if (p == NULL) {
        atomicAdd(nulls, 1ull);
        return;
    }
    for (uint64_t i = 0; i < bytes / 8; i++) p[i] = pattern(t, i);
}

__global__ void check_and_free(gm_heap heap, uint64_t **ptrs, uint64_t n,
                               unsigned long long *mismatches) {
    uint64_t t = blockIdx.x * (uint64_t)blockDim.x + threadIdx.x;
    if (t >= n) return;
    uint64_t *p = ptrs[t];
    if (p == NULL) return;
    for (uint64_t i = 0; i < size_of_thread(t) / 8; i++) {
        if (p[i] != pattern(t, i)) {
            atomicAdd(mismatches, 1ull);
            break;
        }
    }
    gallatin_free(&heap, p);
}

// Exits with the C API's last error if `status` is not GM_OK.
static void check_gm(gm_status status, const char *what) {
    if (status == GM_OK) return;
    char msg[512];
    gm_heap_last_error(msg, sizeof msg);
    fprintf(stderr, "%s: status %d: %s\n", what, (int)status, msg);
    exit(1);
}

static void check_cuda(cudaError_t e, const char *what) {
    if (e == cudaSuccess) return;
    fprintf(stderr, "%s: %s\n", what, cudaGetErrorString(e));
    exit(1);
}

int main(int argc, char **argv) {
    uint64_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : (1ull << 20);
    uint64_t heap_bytes = 2ull << 30;

    // The runtime first, so the heap shares its (primary) context.
    check_cuda(cudaSetDevice(0), "cudaSetDevice");
    check_cuda(cudaFree(0), "cudaFree(0)");
    // The linked device_c_abi.ptx must be built over this library's heap
    // layout: a stale one is refused here instead of corrupting the heap.
    check_gm(gm_check_device_layout(), "gm_check_device_layout");

    gm_device_heap *dheap = NULL;
    check_gm(gm_heap_create(0, heap_bytes, GM_HEAP_CHECKED, &dheap), "gm_heap_create");
    gm_heap heap;
    check_gm(gm_heap_handle(dheap, &heap), "gm_heap_handle");

    uint64_t **ptrs;
    unsigned long long *counters;  // [0] nulls, [1] mismatches
    check_cuda(cudaMalloc(&ptrs, n * sizeof *ptrs), "cudaMalloc(ptrs)");
    check_cuda(cudaMalloc(&counters, 2 * sizeof *counters), "cudaMalloc(counters)");
    check_cuda(cudaMemset(counters, 0, 2 * sizeof *counters), "cudaMemset");

    unsigned threads = 256;
    unsigned blocks = (unsigned)((n + threads - 1) / threads);
    alloc_and_fill<<<blocks, threads>>>(heap, ptrs, n, counters);
    check_cuda(cudaGetLastError(), "launch alloc_and_fill");
    check_cuda(cudaDeviceSynchronize(), "alloc_and_fill");

    gm_heap_stats live;
    check_gm(gm_heap_stats_get(dheap, &live), "gm_heap_stats_get (live)");

    check_and_free<<<blocks, threads>>>(heap, ptrs, n, counters + 1);
    check_cuda(cudaGetLastError(), "launch check_and_free");
    check_cuda(cudaDeviceSynchronize(), "check_and_free");

    gm_heap_stats after;
    check_gm(gm_heap_stats_get(dheap, &after), "gm_heap_stats_get (after)");
    unsigned long long host_counters[2];
    check_cuda(cudaMemcpy(host_counters, counters, sizeof host_counters, cudaMemcpyDeviceToHost),
               "cudaMemcpy(counters)");

    uint64_t expected_bytes = 0;
    for (uint64_t t = 0; t < n; t++) expected_bytes += size_of_thread(t);
    int pass = host_counters[0] == 0 && host_counters[1] == 0 && live.live_allocations == n &&
               live.live_bytes == expected_bytes && after.live_allocations == 0 &&
               after.live_bytes == 0 && after.invalid_frees == 0 && after.double_frees == 0 &&
               after.failed_mallocs == 0;
    printf("03_alloc_check (C++): %llu threads, %llu MiB heap (%llu segments of %llu MiB): "
           "nulls %llu, mismatches %llu, live between kernels %llu allocations / %llu bytes "
           "(expected %llu / %llu), live after free %llu, bad frees %llu: %s\n",
           (unsigned long long)n, (unsigned long long)(live.heap_bytes >> 20),
           (unsigned long long)live.segments, (unsigned long long)(live.segment_bytes >> 20),
           host_counters[0], host_counters[1], (unsigned long long)live.live_allocations,
           (unsigned long long)live.live_bytes, (unsigned long long)n,
           (unsigned long long)expected_bytes, (unsigned long long)after.live_allocations,
           (unsigned long long)(after.invalid_frees + after.double_frees), pass ? "PASS" : "FAIL");

    check_cuda(cudaFree(ptrs), "cudaFree(ptrs)");
    check_cuda(cudaFree(counters), "cudaFree(counters)");
    gm_heap_destroy(dheap);
    return pass ? 0 : 1;
}
