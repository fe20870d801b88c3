#include "common/spmm_tuning.h"

#include <algorithm>
#include <atomic>
#include <cstring>
#include <limits>
#include <list>
#include <mutex>
#include <unordered_map>

#include "common/native_caches.h"

namespace sparsetorch {
namespace tuning {

int64_t log2_bucket(int64_t v) {
  if (v <= 0) return 0;
  return 64 - __builtin_clzll(static_cast<unsigned long long>(v));
}

int64_t share_level(double share) {
  if (!(share >= 0.02)) return 0;  // NaN too
  if (share < 0.10) return 1;
  if (share < 0.50) return 2;
  return 3;
}

// --- devices ----------------------------------------------------------------------------------------

namespace {

struct DeviceNames {
  std::mutex mutex;
  std::vector<std::string> names;
  std::unordered_map<std::string, int32_t> ids;
  std::vector<int32_t> cuda_ids;  // by device index; -1: not asked yet
  CudaDeviceNamer namer = nullptr;
};

DeviceNames& device_names() {
  static DeviceNames* d = new DeviceNames();  // never destroyed: used from atexit handlers too
  return *d;
}

int32_t intern_locked(DeviceNames& d, const std::string& name) {
  auto it = d.ids.find(name);
  if (it != d.ids.end()) return it->second;
  const auto id = static_cast<int32_t>(d.names.size());
  d.names.push_back(name);
  d.ids.emplace(name, id);
  return id;
}

}  // namespace

int32_t device_id(const std::string& name) {
  DeviceNames& d = device_names();
  std::lock_guard<std::mutex> lock(d.mutex);
  return intern_locked(d, name);
}

std::string device_name(int32_t id) {
  DeviceNames& d = device_names();
  std::lock_guard<std::mutex> lock(d.mutex);
  return id >= 0 && static_cast<size_t>(id) < d.names.size() ? d.names[id] : std::string("?");
}

SpmmSignature signature_from_fields(const std::string& device, c10::IntArrayRef fields, const char* what) {
  TORCH_CHECK_VALUE(fields.size() == kFields, what, ": a signature has ", static_cast<int>(kFields), " fields, got ",
                    fields.size());
  SpmmSignature s;
  s.device = device_id(device);
  std::copy(fields.begin(), fields.end(), s.f.begin());
  return s;
}

int32_t device_id(const at::Device& device) {
  if (!device.is_cuda()) return device_id(std::string(c10::DeviceTypeName(device.type(), /*lower_case=*/true)));
  const int index = device.has_index() ? device.index() : 0;
  DeviceNames& d = device_names();
  {
    std::lock_guard<std::mutex> lock(d.mutex);
    if (static_cast<size_t>(index) < d.cuda_ids.size() && d.cuda_ids[index] >= 0) return d.cuda_ids[index];
  }
  CudaDeviceNamer namer;
  {
    std::lock_guard<std::mutex> lock(d.mutex);
    namer = d.namer;
  }
  const std::string name = namer ? namer(static_cast<c10::DeviceIndex>(index)) : "cuda:" + std::to_string(index);
  std::lock_guard<std::mutex> lock(d.mutex);
  if (d.cuda_ids.size() <= static_cast<size_t>(index)) d.cuda_ids.resize(index + 1, -1);
  return d.cuda_ids[index] = intern_locked(d, name);
}

void set_cuda_device_namer(CudaDeviceNamer namer) {
  DeviceNames& d = device_names();
  std::lock_guard<std::mutex> lock(d.mutex);
  d.namer = namer;
  d.cuda_ids.clear();
}

// --- signatures -------------------------------------------------------------------------------------

int64_t b_layout(const at::Tensor& dense) {
  if (dense.size(-1) != 1 && dense.stride(-1) != 1) return 2;
  const int64_t elem = static_cast<int64_t>(dense.element_size());
  const bool aligned = reinterpret_cast<uintptr_t>(dense.data_ptr()) % 16 == 0 && (dense.stride(-2) * elem) % 16 == 0 &&
                       (dense.dim() < 3 || (dense.stride(0) * elem) % 16 == 0);
  return aligned ? 0 : 1;
}

namespace {
double entry_share_from(const CsrAnalysis& a, int64_t len) {
  if (a.entries() <= 0) return 0.0;
  int64_t total = 0;
  for (int b = csr_stats::bin_of(len - 1) + 1; b < csr_stats::kHistBins; ++b) total += a.raw[csr_stats::kEntryHist + b];
  return static_cast<double>(total) / static_cast<double>(a.entries());
}
}  // namespace

SpmmSignature signature(const SpmmProblem& p, at::ScalarType dtype, const CsrAnalysis& a, int64_t layout,
                        int32_t device) {
  SpmmSignature s;
  s.device = device;
  s.f[kDtype] = static_cast<int64_t>(dtype);
  s.f[kWidth] = p.n;
  s.f[kBatchFlags] = (p.pattern_batched ? 1 : 0) | (p.values_batched ? 2 : 0) | (p.dense_batched ? 4 : 0) |
                     (p.batched ? 8 : 0);
  s.f[kBatchBucket] = std::max<int64_t>(0, log2_bucket(p.batch) - 1);
  s.f[kBLayout] = layout;
  s.f[kRowsBucket] = log2_bucket(p.m);
  s.f[kColsBucket] = log2_bucket(p.k);
  s.f[kEntriesBucket] = log2_bucket(a.entries() / std::max<int64_t>(1, a.batch));
  s.f[kLongestRowBin] = a.max_row() > 0 ? 1 + csr_stats::bin_of(a.max_row()) : 0;
  s.f[kShare64] = share_level(entry_share_from(a, 64));
  s.f[kShare256] = share_level(entry_share_from(a, 256));
  s.f[kShare4096] = share_level(entry_share_from(a, 4096));
  s.f[kEmptyShare] =
      share_level(a.rows() > 0 ? static_cast<double>(a.empty_rows()) / static_cast<double>(a.rows()) : 0.0);
  return s;
}

double product_work(const SpmmProblem& p, const CsrAnalysis& a) {
  const double entries = static_cast<double>(a.entries()) * (p.pattern_batched ? 1.0 : static_cast<double>(p.batch));
  const double rows = static_cast<double>(p.m) * static_cast<double>(p.batch);
  return std::max(1.0, (entries + rows) * static_cast<double>(std::max<int64_t>(p.n, 1)));
}

// --- the table ------------------------------------------------------------------------------------

namespace {

struct SignatureHash {
  size_t operator()(const SpmmSignature& s) const {
    uint64_t h = 1469598103934665603ull ^ static_cast<uint64_t>(s.device);
    for (int64_t v : s.f) {
      h ^= static_cast<uint64_t>(v) + 0x9e3779b97f4a7c15ull + (h << 6) + (h >> 2);
      h *= 1099511628211ull;
    }
    return static_cast<size_t>(h);
  }
};

struct Candidate {
  SpmmBackend route = SpmmBackend::Auto;
  int issued = 0;    // samples handed out, warm-up included
  int warm = 0;      // warm-up samples received (discarded)
  int skipped = 0;   // calls on which it was due but the matrix did not offer it
  std::vector<double> costs;
  bool dropped = false;
  bool failed = false;
};

struct Entry {
  std::optional<SpmmBackend> decided;
  std::vector<Candidate> cands;  // rotation order: the first matrix's rules route first
  bool pruned = false;           // the pruning after one counted sample each is done
  double ref_work = 0.0;         // the first counted sample's work: device times are scaled to it
  std::list<SpmmSignature>::iterator lru;
};

// A candidate's cost: its smallest counted sample (a disturbance of a sample only adds time; tuning.py's
// module docstring).
double least(const std::vector<double>& v) {
  return v.empty() ? std::numeric_limits<double>::infinity() : *std::min_element(v.begin(), v.end());
}

bool offered(const std::vector<SpmmBackend>& candidates, SpmmBackend route) {
  return std::find(candidates.begin(), candidates.end(), route) != candidates.end();
}

std::atomic<PendingPoller>& poller_slot() {
  static std::atomic<PendingPoller> poller{nullptr};
  return poller;
}

}  // namespace

struct TuningTable::Impl {
  std::mutex mutex;
  std::unordered_map<SpmmSignature, Entry, SignatureHash> map;
  std::list<SpmmSignature> lru;  // front: most recently used
  int64_t capacity = kDefaultCapacity;
  int64_t generation = 0;

  void touch(Entry& e) { lru.splice(lru.begin(), lru, e.lru); }

  Entry& create(const SpmmSignature& sig) {
    auto [it, inserted] = map.emplace(sig, Entry{});
    if (inserted) {
      lru.push_front(sig);
      it->second.lru = lru.begin();
      evict();
      return map.find(sig)->second;  // (eviction never drops the front)
    }
    touch(it->second);
    return it->second;
  }

  void evict() {
    while (static_cast<int64_t>(map.size()) > capacity && !lru.empty()) {
      map.erase(lru.back());
      lru.pop_back();
    }
  }

  Candidate* find(Entry& e, SpmmBackend route) {
    for (Candidate& c : e.cands) {
      if (c.route == route) return &c;
    }
    return nullptr;
  }

  void set_decided(Entry& e, SpmmBackend route) {
    e.decided = route;
    ++generation;
  }

  // Prunes after one counted sample each (never the rules' route, first); decides once every survivor has
  // kSamples.
  void evaluate(Entry& e) {
    if (e.decided) return;
    std::vector<Candidate*> active;
    for (Candidate& c : e.cands) {
      if (!c.dropped) active.push_back(&c);
    }
    if (active.empty()) {  // every candidate failed: the rules' route (first) it is
      if (!e.cands.empty()) set_decided(e, e.cands.front().route);
      return;
    }
    for (Candidate* c : active) {
      if (c->costs.empty()) return;
    }
    if (!e.pruned) {
      double best = std::numeric_limits<double>::infinity();
      for (Candidate* c : active) best = std::min(best, least(c->costs));
      for (Candidate* c : active) {
        if (c != &e.cands.front() && least(c->costs) > kPruneFactor * best) c->dropped = true;
      }
      e.pruned = true;
      active.erase(std::remove_if(active.begin(), active.end(), [](Candidate* c) { return c->dropped; }), active.end());
    }
    if (active.size() > 1) {
      for (Candidate* c : active) {
        if (static_cast<int>(c->costs.size()) < kSamples) return;
      }
    }
    Candidate* best = active.front();
    for (Candidate* c : active) {
      if (least(c->costs) < least(best->costs)) best = c;  // ties: the rules' route (first)
    }
    set_decided(e, best->route);
  }
};

TuningTable& TuningTable::global() {
  static TuningTable* table = new TuningTable();  // never destroyed: used from atexit handlers too
  return *table;
}

TuningTable::Impl& TuningTable::impl() {
  static Impl* impl = new Impl();
  return *impl;
}

std::optional<SpmmBackend> TuningTable::decided(const SpmmSignature& sig) {
  Impl& t = impl();
  std::lock_guard<std::mutex> lock(t.mutex);
  auto it = t.map.find(sig);
  if (it == t.map.end()) return std::nullopt;
  t.touch(it->second);
  return it->second.decided;
}

TuningChoice TuningTable::next(const SpmmSignature& sig, const std::vector<SpmmBackend>& candidates, bool tune) {
  TORCH_CHECK(!candidates.empty(), "spmm tuning: no candidate route");
  const SpmmBackend rules = candidates.front();
  Impl& t = impl();
  std::lock_guard<std::mutex> lock(t.mutex);
  auto it = t.map.find(sig);
  if (it != t.map.end()) t.touch(it->second);
  if (it != t.map.end() && it->second.decided) {
    const SpmmBackend d = *it->second.decided;
    return {offered(candidates, d) ? d : rules, false};
  }
  if (!tune) return {rules, false};
  Entry& e = it != t.map.end() ? it->second : t.create(sig);
  if (e.cands.empty() && !e.decided) {
    for (SpmmBackend r : candidates) {
      if (!t.find(e, r)) {
        Candidate c;
        c.route = r;
        e.cands.push_back(c);
      }
    }
    if (e.cands.size() == 1) {  // nothing to compare
      t.set_decided(e, rules);
      return {rules, false};
    }
  }
  // The next sample: the candidate with the fewest handed out, below the target (a warm-up and one counted
  // sample each before the pruning, kSamples counted after it); ties in rotation order, turned by one every
  // round of handouts (signatures called at fixed places in a step get each route sampled at each place).
  const int target = kWarmupSamples + (e.pruned ? kSamples : 1);
  const size_t n = e.cands.size();
  size_t handed = 0;
  for (const Candidate& c : e.cands) handed += static_cast<size_t>(c.issued);
  const size_t turn = n ? handed / n : 0;
  Candidate* pick = nullptr;
  bool dropped_any = false;
  for (size_t i = 0; i < n; ++i) {
    Candidate& c = e.cands[(i + turn) % n];
    if (c.dropped || c.issued >= target) continue;
    if (!offered(candidates, c.route)) {
      if (++c.skipped > kMaxSkips) {
        c.dropped = true;
        dropped_any = true;
      }
      continue;
    }
    if (pick == nullptr || c.issued < pick->issued) pick = &c;
  }
  if (dropped_any) t.evaluate(e);
  if (e.decided) return {offered(candidates, *e.decided) ? *e.decided : rules, false};
  if (pick != nullptr) {
    ++pick->issued;
    return {pick->route, true};
  }
  // Every needed sample is in flight: the best route so far (the rules' until samples are in).
  const Candidate* best = nullptr;
  for (const Candidate& c : e.cands) {
    if (c.dropped || c.costs.empty() || !offered(candidates, c.route)) continue;
    if (best == nullptr || least(c.costs) < least(best->costs)) best = &c;
  }
  return {best ? best->route : rules, false};
}

void TuningTable::record(const SpmmSignature& sig, SpmmBackend route, double device_ms, double host_ms,
                         double work) {
  Impl& t = impl();
  std::lock_guard<std::mutex> lock(t.mutex);
  auto it = t.map.find(sig);
  if (it == t.map.end() || it->second.decided) return;  // evicted, cleared or decided meanwhile
  Entry& e = it->second;
  Candidate* c = t.find(e, route);
  if (c == nullptr || c->dropped) return;
  if (c->warm < kWarmupSamples) {
    ++c->warm;
    return;
  }
  if (!(work > 0.0)) work = 1.0;
  if (e.ref_work <= 0.0) e.ref_work = work;
  const double scaled = std::max(0.0, device_ms) * e.ref_work / work;
  c->costs.push_back(std::max(scaled, std::max(0.0, host_ms)));
  t.evaluate(e);
}

void TuningTable::lost(const SpmmSignature& sig, SpmmBackend route) {
  Impl& t = impl();
  std::lock_guard<std::mutex> lock(t.mutex);
  auto it = t.map.find(sig);
  if (it == t.map.end()) return;
  Candidate* c = t.find(it->second, route);
  if (c != nullptr && c->issued > 0) --c->issued;
}

void TuningTable::fail(const SpmmSignature& sig, SpmmBackend route) {
  Impl& t = impl();
  std::lock_guard<std::mutex> lock(t.mutex);
  auto it = t.map.find(sig);
  if (it == t.map.end()) return;
  Candidate* c = t.find(it->second, route);
  if (c == nullptr) return;
  c->dropped = c->failed = true;
  t.evaluate(it->second);
}

void TuningTable::decide(const SpmmSignature& sig, SpmmBackend route, bool overwrite) {
  TORCH_CHECK(route != SpmmBackend::Auto, "spmm tuning: 'auto' is not a route");
  Impl& t = impl();
  std::lock_guard<std::mutex> lock(t.mutex);
  auto it = t.map.find(sig);
  if (it != t.map.end() && it->second.decided && !overwrite) return;
  Entry& e = t.create(sig);
  if (!e.decided || *e.decided != route) t.set_decided(e, route);
}

std::vector<EntryView> TuningTable::entries(bool decided_only) {
  Impl& t = impl();
  std::lock_guard<std::mutex> lock(t.mutex);
  std::vector<EntryView> out;
  out.reserve(t.map.size());
  for (auto s = t.lru.rbegin(); s != t.lru.rend(); ++s) {  // least recently used first: importing in order restores it
    const Entry& e = t.map.at(*s);
    if (decided_only && !e.decided) continue;
    EntryView v{*s, e.decided, {}};
    for (const Candidate& c : e.cands) v.candidates.push_back({c.route, c.issued, c.costs, c.dropped, c.failed});
    out.push_back(std::move(v));
  }
  return out;
}

void TuningTable::clear() {
  Impl& t = impl();
  std::lock_guard<std::mutex> lock(t.mutex);
  t.map.clear();
  t.lru.clear();
  ++t.generation;
}

int64_t TuningTable::size() {
  Impl& t = impl();
  std::lock_guard<std::mutex> lock(t.mutex);
  return static_cast<int64_t>(t.map.size());
}

int64_t TuningTable::decided_count() {
  Impl& t = impl();
  std::lock_guard<std::mutex> lock(t.mutex);
  int64_t count = 0;
  for (const auto& kv : t.map) count += kv.second.decided ? 1 : 0;
  return count;
}

int64_t TuningTable::set_capacity(int64_t capacity) {
  TORCH_CHECK_VALUE(capacity > 0, "tuning table capacity must be positive, got ", capacity);
  Impl& t = impl();
  std::lock_guard<std::mutex> lock(t.mutex);
  const int64_t old = t.capacity;
  t.capacity = capacity;
  t.evict();
  return old;
}

int64_t TuningTable::capacity() {
  Impl& t = impl();
  std::lock_guard<std::mutex> lock(t.mutex);
  return t.capacity;
}

int64_t TuningTable::generation() {
  Impl& t = impl();
  std::lock_guard<std::mutex> lock(t.mutex);
  return t.generation;
}

void set_pending_poller(PendingPoller poller) { poller_slot().store(poller); }

int64_t poll_pending() {
  const PendingPoller poller = poller_slot().load();
  return poller ? poller() : 0;
}

namespace {
const bool registered = native_caches::add(
    "spmm_tuning", [] { TuningTable::global().clear(); }, [] { return TuningTable::global().size(); });
}  // namespace

}  // namespace tuning
}  // namespace sparsetorch
