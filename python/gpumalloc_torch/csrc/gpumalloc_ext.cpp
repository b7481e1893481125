// gpumalloc's pool as PyTorch's CUDA allocator: a subclass of PyTorch's
// CUDAPluggableAllocator that forwards everything the pool can do to the
// C ABI of libgpumalloc_torch.so (torch-alloc/src/lib.rs), loaded with
// dlopen at install time.
//
// What the Python hook alone cannot do and this file does:
// - out of memory: the allocation callback throws c10::OutOfMemoryError with
//   the pool's message, which Python sees as torch.cuda.OutOfMemoryError;
// - CUDA graphs and MemPools: allocation windows (beginAllocateToPool /
//   endAllocateToPool) hold PyTorch's stream filter here; each request is
//   routed to the private pool whose filter accepts its stream;
//   createOrIncrefPool / releasePool count the pool's users;
// - record_stream, empty_cache, memory_stats (getDeviceStats),
//   reset_peak_memory_stats, cacheInfo, set_per_process_memory_fraction.
//
// Concurrency: PyTorch calls the allocator from any thread. The open
// windows sit behind one mutex; `open_windows_` lets requests skip it when
// none is open (a relaxed read: a window opened concurrently with a request
// on another thread is not that request's business, as in PyTorch's own
// allocator, whose filters only match the capturing stream). The pool itself
// is thread-safe.

#include <c10/core/CachingDeviceAllocator.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/util/Exception.h>
#include <torch/csrc/cuda/CUDAPluggableAllocator.h>

#include <pybind11/pybind11.h>

#include <cuda_runtime_api.h>
#include <dlfcn.h>

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <mutex>
#include <string>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <vector>

namespace gpumalloc {

// Mirror of `#[repr(C)] GmStats` in torch-alloc/src/lib.rs.
struct GmStats {
  uint64_t active, reserved, peak_active, peak_reserved;
  double fragmentation;
  uint64_t driver_calls, allocated, peak_allocated, waiting, split_free,
      private_free, largest_free, limit, live_allocations, allocs, frees,
      alloc_retries, ooms, event_calls, split_chunks, private_pools, small_rounding,
      large_rounding, lake_free, driver_ns, call_ns, alloc_call_ns,
      free_call_ns, alloc_calls, free_calls, slow_calls, slow_call_ns,
      thread_switches, planned_free, planned_arena, spilled, peak_spilled,
      spills, placement_waits;
};

// Mirror of `#[repr(C)] PoolEntry` in lake/src/pluggable/pool.rs.
struct GmPoolEntry {
  uint64_t addr, size, stream;
};

// The C ABI, resolved once from the shared library.
struct Lib {
  void* (*malloc_in)(uint64_t, int, void*, uint64_t, uint64_t);
  void (*free)(void*, ptrdiff_t, int, void*);
  int (*record_stream)(void*, void*);
  int (*begin_pool)(int, uint64_t, uint64_t);
  int (*end_pool)(int, uint64_t, uint64_t);
  int (*incref_pool)(int, uint64_t, uint64_t);
  int (*release_pool)(int, uint64_t, uint64_t);
  int (*pool_use_count)(int, uint64_t, uint64_t);
  int64_t (*pool_live)(int, uint64_t, uint64_t, uint64_t*, size_t);
  int64_t (*checkpoint)(int, uint64_t, uint64_t, GmPoolEntry*, size_t);
  int (*restore)(int, uint64_t, uint64_t, const GmPoolEntry*, size_t, uint64_t*, size_t,
                 size_t*, uint64_t*, size_t, size_t*);
  int (*set_fraction)(int, double);
  double (*get_fraction)(int);
  int (*last_error)(char*, size_t);
  int (*stats)(int, GmStats*);
  void (*reset_peaks)(int);
  uint64_t (*empty_cache)(int);
};

template <typename F>
void resolve(void* handle, const char* name, F& out) {
  void* sym = dlsym(handle, name);
  TORCH_CHECK(
      sym != nullptr,
      "gpumalloc: ",
      name,
      " not found in the library (rebuild it: cargo build --release -p "
      "torch-alloc)");
  out = reinterpret_cast<F>(sym);
}

Lib load(const std::string& path) {
  void* handle = dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  TORCH_CHECK(handle != nullptr, "gpumalloc: cannot load ", path, ": ", dlerror());
  Lib lib{};
  resolve(handle, "gm_malloc_in", lib.malloc_in);
  resolve(handle, "gm_free", lib.free);
  resolve(handle, "gm_record_stream", lib.record_stream);
  resolve(handle, "gm_begin_allocate_to_pool", lib.begin_pool);
  resolve(handle, "gm_end_allocate_to_pool", lib.end_pool);
  resolve(handle, "gm_incref_pool", lib.incref_pool);
  resolve(handle, "gm_release_pool", lib.release_pool);
  resolve(handle, "gm_pool_use_count", lib.pool_use_count);
  resolve(handle, "gm_pool_live_allocations", lib.pool_live);
  resolve(handle, "gm_checkpoint_pool", lib.checkpoint);
  resolve(handle, "gm_restore_pool", lib.restore);
  resolve(handle, "gm_set_memory_fraction", lib.set_fraction);
  resolve(handle, "gm_get_memory_fraction", lib.get_fraction);
  resolve(handle, "gm_last_error", lib.last_error);
  resolve(handle, "gm_stats", lib.stats);
  resolve(handle, "gm_reset_peaks", lib.reset_peaks);
  resolve(handle, "gm_empty_cache", lib.empty_cache);
  return lib;
}

// The thread's last error from the library: kind (0 none, 1 out of memory,
// 2 other) and message.
std::pair<int, std::string> last_error(const Lib& lib) {
  char buf[4096];
  int kind = lib.last_error(buf, sizeof(buf));
  return {kind, kind == 0 ? std::string() : std::string(buf)};
}

// Throws the library's last error (after a call answered -1).
void raise_last(const Lib& lib, const char* what) {
  auto [kind, msg] = last_error(lib);
  TORCH_CHECK(false, "gpumalloc: ", what, " failed: ", msg);
}

// An open allocation window: requests on `device` whose stream `filter`
// accepts go to private pool `pool`.
struct Window {
  c10::DeviceIndex device;
  c10::cuda::MempoolId_t pool;
  std::function<bool(cudaStream_t)> filter;
};

// State shared by the allocator and its allocation callbacks.
struct Shared {
  Lib lib;
  std::mutex mutex;
  std::vector<Window> windows;
  std::atomic<int> open_windows{0};
  // Per device, the allocation and free counts at the last
  // resetAccumulatedStats.
  std::unordered_map<int, std::pair<uint64_t, uint64_t>> accumulated_base;
  // Allocations made again by setCheckpointPoolState, freed by
  // `restored_delete` (the base class cannot record them): address ->
  // (size, device, stream).
  std::unordered_map<void*, std::tuple<size_t, int, cudaStream_t>> restored;

  // The private pool a request on (device, stream) goes to; {0, 0} for the
  // general pool.
  c10::cuda::MempoolId_t route(int device, cudaStream_t stream) {
    if (open_windows.load(std::memory_order_relaxed) == 0) {
      return {0, 0};
    }
    std::lock_guard<std::mutex> lock(mutex);
    for (auto& w : windows) {
      if (w.device == device && w.filter(stream)) {
        return w.pool;
      }
    }
    return {0, 0};
  }

  void* allocate(size_t size, int device, cudaStream_t stream) {
    if (size == 0) {
      return nullptr;
    }
    auto pool = route(device, stream);
    void* p = lib.malloc_in(size, device, stream, pool.first, pool.second);
    if (p == nullptr) {
      auto [kind, msg] = last_error(lib);
      TORCH_CHECK_WITH(OutOfMemoryError, kind != 1, msg);
      TORCH_CHECK(false, "gpumalloc: allocation of ", size, " bytes failed: ", msg);
    }
    return p;
  }

  void release(void* ptr, size_t size, int device, cudaStream_t stream) {
    lib.free(ptr, static_cast<ptrdiff_t>(size), device, stream);
    auto [kind, msg] = last_error(lib);
    if (kind != 0) {
      TORCH_WARN("gpumalloc: free failed: ", msg);
    }
  }
};

// A private pool's live allocations, as getCheckpointState records them.
struct PoolCheckpoint : c10::cuda::CUDACachingAllocator::AllocatorState {
  c10::DeviceIndex device;
  c10::cuda::MempoolId_t pool;
  std::vector<GmPoolEntry> entries;
};

// The state the deleter of restored allocations reaches (a plain function
// pointer, as DataPtr wants).
std::shared_ptr<Shared> g_shared;

void restored_delete(void* ptr) {
  std::tuple<size_t, int, cudaStream_t> where;
  {
    std::lock_guard<std::mutex> lock(g_shared->mutex);
    auto it = g_shared->restored.find(ptr);
    if (it == g_shared->restored.end()) {
      return;
    }
    where = it->second;
    g_shared->restored.erase(it);
  }
  auto [size, device, stream] = where;
  g_shared->release(ptr, size, device, stream);
}

using Base = torch::cuda::CUDAPluggableAllocator::CUDAPluggableAllocator;

class Allocator : public Base {
 public:
  explicit Allocator(std::shared_ptr<Shared> shared)
      : Base(
            [shared](size_t size, int device, cudaStream_t stream) {
              return shared->allocate(size, device, stream);
            },
            [shared](void* ptr, size_t size, int device, cudaStream_t stream) {
              shared->release(ptr, size, device, stream);
            }),
        shared_(std::move(shared)) {}

  std::string name() override {
    return "gpumalloc";
  }

  // Our memory is mapped with access for its own device only (CUDA virtual
  // memory), so a plain device-to-device copy between two GPUs is refused;
  // the peer copy works whatever the mappings.
  cudaError_t memcpyAsync(
      void* dst,
      int dst_device,
      const void* src,
      int src_device,
      size_t count,
      cudaStream_t stream,
      bool /*p2p_enabled*/) override {
    if (dst_device == src_device) {
      return cudaMemcpyAsync(dst, src, count, cudaMemcpyDeviceToDevice, stream);
    }
    return cudaMemcpyPeerAsync(dst, dst_device, src, src_device, count, stream);
  }

  void beginAllocateToPool(
      c10::DeviceIndex device,
      c10::cuda::MempoolId_t pool,
      std::function<bool(cudaStream_t)> filter) override {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    if (lib().begin_pool(device, pool.first, pool.second) != 0) {
      raise_last(lib(), "beginAllocateToPool");
    }
    shared_->windows.push_back(Window{device, pool, std::move(filter)});
    shared_->open_windows.fetch_add(1, std::memory_order_relaxed);
  }

  void endAllocateToPool(c10::DeviceIndex device, c10::cuda::MempoolId_t pool)
      override {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    auto& w = shared_->windows;
    for (auto it = w.begin(); it != w.end(); ++it) {
      if (it->device == device && it->pool == pool) {
        w.erase(it);
        shared_->open_windows.fetch_sub(1, std::memory_order_relaxed);
        break;
      }
    }
    if (lib().end_pool(device, pool.first, pool.second) != 0) {
      raise_last(lib(), "endAllocateToPool");
    }
  }

  void releasePool(c10::DeviceIndex device, c10::cuda::MempoolId_t pool)
      override {
    if (lib().release_pool(device, pool.first, pool.second) != 0) {
      raise_last(lib(), "releasePool");
    }
  }

  void createOrIncrefPool(
      c10::DeviceIndex device,
      c10::cuda::MempoolId_t pool,
      std::shared_ptr<c10::cuda::CUDACachingAllocator::CUDAAllocator>
          allocator) override {
    TORCH_CHECK(
        allocator == nullptr || allocator.get() == this,
        "gpumalloc: a MemPool with its own allocator is not supported while "
        "gpumalloc is PyTorch's allocator");
    if (lib().incref_pool(device, pool.first, pool.second) != 0) {
      raise_last(lib(), "createOrIncrefPool");
    }
  }

  int getPoolUseCount(c10::DeviceIndex device, c10::cuda::MempoolId_t pool)
      override {
    return lib().pool_use_count(device, pool.first, pool.second);
  }

  bool checkPoolLiveAllocations(
      c10::DeviceIndex device,
      c10::cuda::MempoolId_t pool,
      const std::unordered_set<void*>& expected) override {
    std::vector<uint64_t> live(expected.size() + 1);
    int64_t n = lib().pool_live(device, pool.first, pool.second, live.data(), live.size());
    if (n < 0) {
      raise_last(lib(), "checkPoolLiveAllocations");
    }
    if (static_cast<size_t>(n) != expected.size()) {
      return false;
    }
    for (int64_t i = 0; i < n; ++i) {
      if (expected.count(reinterpret_cast<void*>(live[i])) == 0) {
        return false;
      }
    }
    return true;
  }

  std::shared_ptr<c10::cuda::CUDACachingAllocator::AllocatorState>
  getCheckpointState(c10::DeviceIndex device, c10::cuda::MempoolId_t pool) override {
    auto state = std::make_shared<PoolCheckpoint>();
    state->device = device;
    state->pool = pool;
    int64_t n = lib().checkpoint(device, pool.first, pool.second, nullptr, 0);
    if (n < 0) {
      raise_last(lib(), "getCheckpointState");
    }
    state->entries.resize(static_cast<size_t>(n));
    n = lib().checkpoint(device, pool.first, pool.second, state->entries.data(),
                         state->entries.size());
    TORCH_CHECK(static_cast<size_t>(n) == state->entries.size(),
                "gpumalloc: the pool changed while a checkpoint was taken");
    return state;
  }

  c10::cuda::CUDACachingAllocator::CheckpointDelta setCheckpointPoolState(
      c10::DeviceIndex device,
      std::shared_ptr<c10::cuda::CUDACachingAllocator::AllocatorState> pps) override {
    auto state = std::dynamic_pointer_cast<PoolCheckpoint>(pps);
    TORCH_CHECK(state != nullptr && state->device == device,
                "gpumalloc: setCheckpointPoolState got a checkpoint it did not make");
    auto pool = state->pool;
    int64_t live = lib().pool_live(device, pool.first, pool.second, nullptr, 0);
    if (live < 0) {
      raise_last(lib(), "setCheckpointPoolState");
    }
    std::vector<uint64_t> freed(static_cast<size_t>(live));
    std::vector<uint64_t> allocated(state->entries.size());
    size_t n_freed = 0, n_allocated = 0;
    if (lib().restore(device, pool.first, pool.second, state->entries.data(),
                      state->entries.size(), freed.data(), freed.size(), &n_freed,
                      allocated.data(), allocated.size(), &n_allocated) != 0) {
      raise_last(lib(), "setCheckpointPoolState");
    }
    c10::cuda::CUDACachingAllocator::CheckpointDelta delta;
    std::unordered_map<uint64_t, const GmPoolEntry*> by_addr;
    for (auto& e : state->entries) {
      by_addr[e.addr] = &e;
    }
    {
      // The pool freed these: the base class forgets them (their storages'
      // deleters are removed by PyTorch).
      std::lock_guard<std::mutex> lock(allocator_mutex_);
      for (size_t i = 0; i < n_freed; ++i) {
        void* p = reinterpret_cast<void*>(freed[i]);
        allocation_metadata_.erase(p);
        delta.ptrs_freed.push_back(p);
      }
    }
    std::lock_guard<std::mutex> lock(shared_->mutex);
    for (size_t i = 0; i < n_freed; ++i) {
      shared_->restored.erase(reinterpret_cast<void*>(freed[i]));
    }
    for (size_t i = 0; i < n_allocated; ++i) {
      const GmPoolEntry* e = by_addr.at(allocated[i]);
      void* p = reinterpret_cast<void*>(e->addr);
      shared_->restored[p] = {static_cast<size_t>(e->size), device,
                              reinterpret_cast<cudaStream_t>(e->stream)};
      delta.dataptrs_allocd.emplace_back(
          p, p, &restored_delete, c10::Device(c10::DeviceType::CUDA, device));
    }
    return delta;
  }

  void emptyCache(c10::cuda::MempoolId_t /*pool*/) override {
    lib().empty_cache(-1);
    auto [kind, msg] = last_error(lib());
    if (kind != 0) {
      TORCH_WARN("gpumalloc: empty_cache: ", msg);
    }
  }

  void recordStream(const c10::DataPtr& ptr, c10::cuda::CUDAStream stream)
      override {
    if (ptr.get() == nullptr) {
      return;
    }
    if (lib().record_stream(ptr.get(), stream.stream()) != 0) {
      raise_last(lib(), "recordStream");
    }
  }

  void setMemoryFraction(double fraction, c10::DeviceIndex device) override {
    if (lib().set_fraction(device, fraction) != 0) {
      raise_last(lib(), "setMemoryFraction");
    }
  }

  double getMemoryFraction(c10::DeviceIndex device) override {
    double f = lib().get_fraction(device);
    if (f < 0) {
      raise_last(lib(), "getMemoryFraction");
    }
    return f;
  }

  void cacheInfo(c10::DeviceIndex device, size_t* largest) override {
    *largest = static_cast<size_t>(stats(device).largest_free);
  }

  c10::CachingDeviceAllocator::DeviceStats getDeviceStats(
      c10::DeviceIndex device) override {
    GmStats s = stats(device);
    c10::CachingDeviceAllocator::DeviceStats out;
    auto base = accumulated_base(device);
    auto fill = [](auto& array, int64_t current, int64_t peak,
                   int64_t allocated, int64_t freed) {
      auto& all = array[static_cast<size_t>(c10::CachingAllocator::StatType::AGGREGATE)];
      all.current = current;
      all.peak = peak;
      all.allocated = allocated;
      all.freed = freed;
    };
    auto allocs = static_cast<int64_t>(s.allocs - base.first);
    auto frees = static_cast<int64_t>(s.frees - base.second);
    fill(out.allocation, s.live_allocations, s.live_allocations, allocs, frees);
    fill(out.allocated_bytes, s.allocated, s.peak_allocated, 0, 0);
    fill(out.requested_bytes, s.active, s.peak_active, 0, 0);
    // Blocks waiting for other streams' events are still in use.
    fill(out.active_bytes, s.allocated + s.waiting, s.peak_allocated, 0, 0);
    fill(out.reserved_bytes, s.reserved, s.peak_reserved, 0, 0);
    fill(out.inactive_split_bytes, s.split_free, s.split_free, 0, 0);
    fill(out.segment, s.split_chunks, s.split_chunks, 0, 0);
    out.num_alloc_retries = static_cast<int64_t>(s.alloc_retries);
    out.num_ooms = static_cast<int64_t>(s.ooms);
    out.num_device_alloc = static_cast<int64_t>(s.driver_calls);
    return out;
  }

  void resetPeakStats(c10::DeviceIndex device) override {
    lib().reset_peaks(device);
  }

  void resetAccumulatedStats(c10::DeviceIndex device) override {
    GmStats s = stats(device);
    std::lock_guard<std::mutex> lock(shared_->mutex);
    shared_->accumulated_base[device] = {s.allocs, s.frees};
  }

 private:
  const Lib& lib() const {
    return shared_->lib;
  }

  GmStats stats(c10::DeviceIndex device) {
    GmStats s{};
    if (lib().stats(device, &s) != 0) {
      raise_last(lib(), "stats");
    }
    return s;
  }

  std::pair<uint64_t, uint64_t> accumulated_base(c10::DeviceIndex device) {
    std::lock_guard<std::mutex> lock(shared_->mutex);
    auto it = shared_->accumulated_base.find(device);
    return it == shared_->accumulated_base.end() ? std::make_pair(uint64_t{0}, uint64_t{0})
                                                 : it->second;
  }

  std::shared_ptr<Shared> shared_;
};

std::shared_ptr<Allocator> installed;

// Makes gpumalloc PyTorch's CUDA allocator (before CUDA's first allocation).
void install(const std::string& path) {
  if (installed) {
    return;
  }
  auto shared = std::make_shared<Shared>();
  shared->lib = load(path);
  g_shared = shared;
  auto allocator = std::make_shared<Allocator>(shared);
  allocator->init(0);
  torch::cuda::CUDAPluggableAllocator::changeCurrentAllocator(allocator);
  installed = allocator;
}

bool is_installed() {
  return installed != nullptr &&
      c10::cuda::CUDACachingAllocator::get() == installed.get();
}

}  // namespace gpumalloc

PYBIND11_MODULE(TORCH_EXTENSION_NAME, m) {
  m.doc() = "gpumalloc as PyTorch's CUDA allocator";
  m.def("install", &gpumalloc::install, "Install gpumalloc from the shared library at path");
  m.def("is_installed", &gpumalloc::is_installed, "Whether gpumalloc is PyTorch's CUDA allocator");
}
