// pooled_empty_cpu (conv_tp_ops.h): CPU tensors for the conv TP's [edges, weights] gradients, whose
// memory is kept in a small pool when they are freed. glibc hands blocks this large back to the
// system, and a new tensor of the same size would pay the page faults of its first touch again
// (a fresh [39000, 1280] float32 tensor takes 35 ms to fill on 2 cores, a reused one 5 ms).
#include <algorithm>
#include <cstdlib>
#include <mutex>
#include <vector>

#include "conv_tp_ops.h"

namespace cfm {
namespace conv_tp {
namespace {

constexpr std::size_t kMinBytes = std::size_t(8) << 20;   // smaller blocks: malloc's own reuse
constexpr std::size_t kRound = std::size_t(2) << 20;      // capacities in 2 MiB steps
constexpr std::size_t kBlocks = 4;                        // blocks kept at most

struct Pool {
  std::mutex mutex;
  std::vector<std::pair<void*, std::size_t>> free;  // (block, capacity), oldest first

  // A block of at least `bytes`: the smallest kept one that is not over half again as large,
  // else a new one.
  std::pair<void*, std::size_t> take(std::size_t bytes) {
    {
      std::lock_guard<std::mutex> lock(mutex);
      auto best = free.end();
      for (auto it = free.begin(); it != free.end(); ++it)
        if (it->second >= bytes && it->second <= bytes + bytes / 2 && (best == free.end() || it->second < best->second))
          best = it;
      if (best != free.end()) {
        auto block = *best;
        free.erase(best);
        return block;
      }
    }
    const std::size_t capacity = (bytes + kRound - 1) / kRound * kRound;
    void* p = std::aligned_alloc(64, capacity);
    TORCH_CHECK(p != nullptr, "cfm::conv_tp: out of memory allocating ", capacity, " bytes");
    return {p, capacity};
  }

  void give(void* p, std::size_t capacity) {
    void* drop = nullptr;
    {
      std::lock_guard<std::mutex> lock(mutex);
      if (free.size() == kBlocks) {
        drop = free.front().first;
        free.erase(free.begin());
      }
      free.emplace_back(p, capacity);
    }
    std::free(drop);
  }
};

Pool& pool() {
  static Pool* p = new Pool;  // never destroyed: tensors may be freed after static destructors ran
  return *p;
}

}  // namespace

Tensor pooled_empty_cpu(at::IntArrayRef sizes, const at::TensorOptions& options) {
  int64_t n = 1;
  for (auto s : sizes) n *= s;
  const std::size_t bytes = std::size_t(n) * c10::elementSize(c10::typeMetaToScalarType(options.dtype()));
  if (options.device().type() != at::kCPU || bytes < kMinBytes) return at::empty(sizes, options);
  auto [p, capacity] = pool().take(bytes);
  return at::from_blob(p, sizes, [capacity](void* q) { pool().give(q, capacity); }, options);
}

}  // namespace conv_tp
}  // namespace cfm
