// Every cache the native code keeps, listed in one registry so that one call resets them all
// (sparsetorch::_clear_native_caches, which st.clear_caches() calls through sparsetorch/_ops.py) and one
// call counts their entries (sparsetorch::_native_cache_sizes, shown by st.cache_info()).
//
// A cache registers itself next to its definition, from a static initialiser:
//
//   const bool registered = native_caches::add("name", [] { ...clear... }, [] { return ...entries...; });
//
// A thread-local cache (host objects a thread uses without locks: cuSPARSE descriptors, occupancy answers)
// can only be emptied by its own thread. Its clear() empties the calling thread's copy and bumps a
// Generation; every other thread's copy compares the generation it was filled at on its next use and empties
// itself when it is out of date. Its size is the calling thread's.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <string>
#include <utility>
#include <vector>

namespace sparsetorch::native_caches {

// Lists a cache under `name` (unique); returns true, for use as a static initialiser.
bool add(const std::string& name, std::function<void()> clear, std::function<int64_t()> size);

// Empties the cache called `name`, or every cache for "" (a ValueError for an unknown name).
void clear(const std::string& name);

// (name, entries) of every cache, in the order they were listed.
std::vector<std::pair<std::string, int64_t>> sizes();

// The generation a thread-local cache compares its copy against (see the file comment).
class Generation {
 public:
  void bump() { value_.fetch_add(1, std::memory_order_acq_rel); }
  // Whether a copy filled at generation `seen` is out of date; if so, `seen` becomes the current one
  // (the caller empties its copy).
  bool stale(uint64_t& seen) const {
    const uint64_t now = value_.load(std::memory_order_acquire);
    if (seen == now) return false;
    seen = now;
    return true;
  }

 private:
  std::atomic<uint64_t> value_{1};  // copies start at 0: stale on first use, which empties an empty copy
};

}  // namespace sparsetorch::native_caches
