#include "common/native_caches.h"

#include <c10/util/Exception.h>

#include <mutex>

namespace sparsetorch::native_caches {
namespace {

struct Entry {
  std::string name;
  std::function<void()> clear;
  std::function<int64_t()> size;
};

struct Registry {
  std::mutex mutex;
  std::vector<Entry> entries;
};

Registry& registry() {
  static Registry* r = new Registry();  // never destroyed: caches register from static initialisers
  return *r;
}

// A copy of the entries, so that no cache's clear() or size() runs under the registry's lock.
std::vector<Entry> entries() {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  return r.entries;
}

}  // namespace

bool add(const std::string& name, std::function<void()> clear, std::function<int64_t()> size) {
  Registry& r = registry();
  std::lock_guard<std::mutex> lock(r.mutex);
  for (const Entry& e : r.entries) TORCH_INTERNAL_ASSERT(e.name != name, "native cache listed twice: ", name);
  r.entries.push_back(Entry{name, std::move(clear), std::move(size)});
  return true;
}

void clear(const std::string& name) {
  bool found = name.empty();
  for (const Entry& e : entries()) {
    if (name.empty() || e.name == name) {
      e.clear();
      found = true;
    }
  }
  if (!found) {
    std::string known;
    for (const Entry& e : entries()) known += (known.empty() ? "" : ", ") + e.name;
    TORCH_CHECK_VALUE(false, "_clear_native_caches: no native cache called '", name, "'; there are: ", known);
  }
}

std::vector<std::pair<std::string, int64_t>> sizes() {
  std::vector<std::pair<std::string, int64_t>> out;
  for (const Entry& e : entries()) out.emplace_back(e.name, e.size());
  return out;
}

}  // namespace sparsetorch::native_caches
