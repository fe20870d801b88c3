// "auto" measures what the rules cannot know, at the cost of no extra product (docs/tuning.md).
//
// No rule over row-length statistics picks the fastest route on every matrix (the skew suite has cases
// where the best route is 1.3x the rules' choice), but matrices come in families: one graph's layers,
// the subgraphs of a mini-batch loader, a pruned model's weights. Decisions are kept per SIGNATURE of
// the problem (common/spmm_tuning.h), and an undecided signature tunes ONLINE: each "auto" call on a
// matrix of that signature runs the next candidate route as the real call, between two CUDA events of a
// small pool, and its host time is taken around the launch. The events are read at later calls, when
// cudaEventQuery says they have completed -- never with a sync -- and the table decides once every
// surviving candidate has its samples. No call costs more than one run of one candidate route, and a
// stream of similar matrices tunes once.
//
// SpmmPlan asks for an explicit measurement instead (measure_spmm_route, the spmm_tune op): every
// candidate timed in interleaved rounds on the plan's own B, read after one synchronisation.
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <ATen/cuda/CUDAEvent.h>
#include <ATen/cuda/CUDAGraphsUtils.cuh>
#include <c10/cuda/CUDAException.h>
#include <c10/cuda/CUDAGuard.h>
#include <cuda_runtime_api.h>
#include <torch/library.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <limits>
#include <mutex>
#include <string>
#include <vector>

#include "common/native_caches.h"
#include "common/spmm_routing.h"
#include "common/spmm_tuning.h"
#include "cuda/spmm_cuda.h"
#include "cuda/device_code.h"

namespace sparsetorch {
namespace cuda {
namespace {

using Clock = std::chrono::steady_clock;

double ms_since(Clock::time_point t0) { return std::chrono::duration<double, std::milli>(Clock::now() - t0).count(); }

// --- online samples: a pool of event pairs and the samples in flight --------------------------------

// Pairs of timing events per device: at most this many samples are in flight on one device; a call
// that finds none free is not a sample (the table hands its candidate out again later).
constexpr int kEventPairsPerDevice = 32;

struct EventPair {
  cudaEvent_t start = nullptr, stop = nullptr;
  int device = -1;
};

struct InFlight {
  int64_t slot;
  tuning::SpmmSignature sig;
  SpmmBackend route;
  double host_ms;
  double work;
};

struct Sampler {
  std::mutex mutex;
  std::vector<EventPair> slots;           // every pair ever created (never destroyed: reused)
  std::vector<std::vector<int64_t>> free;  // per device: slots not in use
  std::vector<int> created;                // per device
  std::vector<InFlight> in_flight;
  std::atomic<int64_t> count{0};  // in_flight.size(), read without the lock on the fast path
};

Sampler& sampler() {
  static Sampler* s = new Sampler();  // never destroyed: events outlive static destruction order
  return *s;
}

// A free pair of events on `device` (the current device), or -1.
int64_t acquire_slot(int device) {
  Sampler& s = sampler();
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    if (s.free.size() <= static_cast<size_t>(device)) {
      s.free.resize(device + 1);
      s.created.resize(device + 1, 0);
    }
    if (!s.free[device].empty()) {
      const int64_t slot = s.free[device].back();
      s.free[device].pop_back();
      return slot;
    }
    if (s.created[device] >= kEventPairsPerDevice) return -1;
    ++s.created[device];
  }
  EventPair ev;
  ev.device = device;
  if (cudaEventCreate(&ev.start) != cudaSuccess || cudaEventCreate(&ev.stop) != cudaSuccess) {
    (void)cudaGetLastError();
    if (ev.start != nullptr) (void)cudaEventDestroy(ev.start);
    std::lock_guard<std::mutex> lock(s.mutex);
    --s.created[device];
    return -1;
  }
  std::lock_guard<std::mutex> lock(s.mutex);
  s.slots.push_back(ev);
  return static_cast<int64_t>(s.slots.size()) - 1;
}

EventPair slot_events(int64_t slot) {
  Sampler& s = sampler();
  std::lock_guard<std::mutex> lock(s.mutex);
  return s.slots[slot];
}

void release_slot(int64_t slot) {
  Sampler& s = sampler();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.free[s.slots[slot].device].push_back(slot);
}

// Reads the samples whose events have completed (cudaEventQuery: no sync) into the tuning table;
// returns how many are still in flight. Registered as the table's poller (tuning::poll_pending).
int64_t poll_samples() {
  Sampler& s = sampler();
  if (s.count.load(std::memory_order_acquire) == 0) return 0;
  struct Done {
    InFlight sample;
    float device_ms;
    bool ok;
  };
  std::vector<Done> done;
  int64_t remaining;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    std::vector<InFlight> keep;
    for (InFlight& f : s.in_flight) {
      const EventPair& ev = s.slots[f.slot];
      const cudaError_t q = cudaEventQuery(ev.stop);
      if (q == cudaErrorNotReady) {
        keep.push_back(f);
        continue;
      }
      float ms = 0.0f;
      bool ok = q == cudaSuccess && cudaEventElapsedTime(&ms, ev.start, ev.stop) == cudaSuccess;
      if (!ok) (void)cudaGetLastError();  // (a non-sticky error of the query: the sample is lost)
      done.push_back({f, ms, ok});
      s.free[ev.device].push_back(f.slot);
    }
    s.in_flight.swap(keep);
    remaining = static_cast<int64_t>(s.in_flight.size());
    s.count.store(remaining, std::memory_order_release);
  }
  tuning::TuningTable& table = tuning::TuningTable::global();
  for (const Done& d : done) {
    if (d.ok) {
      table.record(d.sample.sig, d.sample.route, d.device_ms, d.sample.host_ms, d.sample.work);
    } else {
      table.lost(d.sample.sig, d.sample.route);
    }
  }
  return remaining;
}

std::string cuda_device_name(c10::DeviceIndex index) { return at::cuda::getDeviceProperties(index)->name; }

const bool kRegistered = [] {
  tuning::set_cuda_device_namer(&cuda_device_name);
  tuning::set_pending_poller(&poll_samples);
  return true;
}();

// The reset of st.clear_caches(): the samples in flight are dropped (reported lost to the table, which hands
// their candidates out again) and their event pairs go back to the pool; the pairs themselves are kept.
void drop_samples() {
  Sampler& s = sampler();
  std::vector<InFlight> dropped;
  {
    std::lock_guard<std::mutex> lock(s.mutex);
    for (const InFlight& f : s.in_flight) s.free[s.slots[f.slot].device].push_back(f.slot);
    dropped.swap(s.in_flight);
    s.count.store(0, std::memory_order_release);
  }
  for (const InFlight& f : dropped) tuning::TuningTable::global().lost(f.sig, f.route);
}

const bool kCacheListed = native_caches::add("spmm_tuning_samples", drop_samples,
                                             [] { return sampler().count.load(std::memory_order_acquire); });

bool capturing() { return at::cuda::currentStreamCaptureStatus() != at::cuda::CaptureStatus::None; }

}  // namespace

SpmmCallRoute tuned_spmm_route(const SpmmProblem& p, at::ScalarType dtype, const ResolvedRoute& r) {
  (void)kRegistered;
  SpmmCallRoute call{r.route, r.rules_route};
  if (!r.has_signature || !r.analysis || !spmm_autotune_enabled() || capturing()) return call;
  poll_samples();
  tuning::TuningTable& table = tuning::TuningTable::global();
  const tuning::TuningChoice choice =
      table.next(r.signature,
                 spmm_tuning_candidates(p, dtype, *r.analysis, r.rules_route,
                                        c10::Device(c10::kCUDA, c10::cuda::current_device())),  // the op's guard
                 /*tune=*/true);
  call.route = choice.route;
  if (!choice.sample) return call;
  const int64_t slot = acquire_slot(c10::cuda::current_device());
  if (slot < 0) {
    table.lost(r.signature, choice.route);
    return call;
  }
  call.sample = true;
  call.event_slot = slot;
  call.signature = r.signature;
  call.work = tuning::product_work(p, *r.analysis);
  return call;
}

void run_spmm_call(const SpmmCallRoute& call, const SpmmProblem& p, const at::Tensor& crow, const at::Tensor& col,
                   const at::Tensor& values, const at::Tensor& dense, const at::Tensor& out,
                   const SpmmEpilogue& epi) {
  if (!call.sample) return run_spmm_route(p, crow, col, values, dense, out, epi, call.route);
  tuning::TuningTable& table = tuning::TuningTable::global();
  const EventPair ev = slot_events(call.event_slot);
  const cudaStream_t stream = at::cuda::getCurrentCUDAStream();
  if (cudaEventRecord(ev.start, stream) != cudaSuccess) {
    (void)cudaGetLastError();
    release_slot(call.event_slot);
    table.lost(call.signature, call.route);
    return run_spmm_route(p, crow, col, values, dense, out, epi, call.route);
  }
  const auto t0 = Clock::now();
  try {
    run_spmm_route(p, crow, col, values, dense, out, epi, call.route);
  } catch (const c10::Error&) {
    // The candidate cannot take this problem (out of memory for densify, ...): never again for this
    // signature; this call takes the rules' route, unless the epilogue reads `out` (it may be half written).
    release_slot(call.event_slot);
    table.fail(call.signature, call.route);
    const bool reads_out = epi.accumulate.defined() && epi.accumulate.storage().is_alias_of(out.storage());
    if (call.route == call.rules_route || call.rules_route == SpmmBackend::Auto || reads_out) throw;
    return run_spmm_route(p, crow, col, values, dense, out, epi, call.rules_route);
  }
  const double host_ms = ms_since(t0);
  if (cudaEventRecord(ev.stop, stream) != cudaSuccess) {
    (void)cudaGetLastError();
    release_slot(call.event_slot);
    table.lost(call.signature, call.route);
    return;
  }
  Sampler& s = sampler();
  std::lock_guard<std::mutex> lock(s.mutex);
  s.in_flight.push_back({call.event_slot, call.signature, call.route, host_ms, call.work});
  s.count.store(static_cast<int64_t>(s.in_flight.size()), std::memory_order_release);
}

// --- explicit measurement (SpmmPlan) ---------------------------------------------------------------

namespace {

template <typename T>
double median(std::vector<T> v) {
  if (v.empty()) return std::numeric_limits<double>::infinity();
  std::nth_element(v.begin(), v.begin() + v.size() / 2, v.end());
  return static_cast<double>(v[v.size() / 2]);
}

// One candidate's samples. Its cost (ms) is what a caller in a loop sees: the larger of its median
// device time and its median host time per call (descriptors, workspace queries, launches): on small
// matrices the host is the limit, and a route that is quick on the device but slow to launch (cuSPARSE,
// ~20 us) loses there.
struct RouteSamples {
  SpmmBackend route;
  std::vector<at::cuda::CUDAEvent> start, stop;
  std::vector<double> host_ms;
  std::vector<float> device_ms;  // read from the events after the synchronisation
  bool failed = false;           // threw while timed: not a candidate
  double cost() const {
    return failed || device_ms.empty() ? std::numeric_limits<double>::infinity()
                                       : std::max(median(device_ms), median(host_ms));
  }
};

}  // namespace

SpmmBackend measure_spmm_route(const SpmmProblem& p, const at::Tensor& crow, const at::Tensor& col,
                               const at::Tensor& values, const at::Tensor& dense, const CsrAnalysis& a) {
  const at::ScalarType dtype = values.scalar_type();
  const SpmmBackend rules = choose_spmm_route(p, dtype, &a, crow.device());
  const std::vector<SpmmBackend> candidates = spmm_tuning_candidates(p, dtype, a, rules, crow.device());
  SpmmBackend best = rules;
  if (candidates.size() > 1) {
    const at::Tensor out = at::empty(p.out_shape(), values.options());
    const SpmmEpilogue epi;  // the product alone: every route's epilogue is the same
    std::vector<RouteSamples> timed;
    for (SpmmBackend route : candidates) {
      try {  // warm-up: workspaces, descriptors, code
        run_spmm_route(p, crow, col, values, dense, out, epi, route);
        timed.push_back(RouteSamples{route});
      } catch (const c10::Error&) {
        // a route that cannot take this problem (out of memory for densify, ...) is skipped
      }
    }
    // The L2 is flushed before each sample only when the product does not fit in it anyway: a loop of
    // small products runs from L2, and a 100 MB memset per sample would cost more than the products.
    const double elem = static_cast<double>(values.element_size());
    const double bytes = static_cast<double>(crow.nbytes() + col.nbytes() + values.nbytes()) +
                         elem * static_cast<double>((p.dense_batched ? p.batch : 1) * p.k * p.n) +
                         static_cast<double>(out.nbytes());
    const int64_t l2 = at::cuda::getCurrentDeviceProperties()->l2CacheSize;
    const at::Tensor flush =
        bytes > static_cast<double>(l2) ? at::empty({2 * std::max<int64_t>(l2, 1 << 20)}, values.options().dtype(at::kByte))
                                        : at::Tensor();
    const at::cuda::CUDAStream stream = at::cuda::getCurrentCUDAStream();
    // Rounds that time every candidate once each, not one candidate after another, so that a clock
    // ramp or a host hiccup falls on all candidates alike. (Timed one after another, with mean host
    // times, the skew suite once saw dwt_992 given the balanced route, 19.6 us a call, over native's 10.0.)
    auto rounds = [&](int count) {
      for (int r = 0; r < count; ++r) {
        for (RouteSamples& s : timed) {
          if (s.failed) continue;
          if (flush.defined()) flush.zero_();
          s.start.emplace_back(cudaEventDefault);
          s.stop.emplace_back(cudaEventDefault);
          s.start.back().record(stream);
          const auto t0 = Clock::now();
          try {
            run_spmm_route(p, crow, col, values, dense, out, epi, s.route);
          } catch (const c10::Error&) {
            s.failed = true;
          }
          s.host_ms.push_back(ms_since(t0));
          s.stop.back().record(stream);
        }
      }
    };
    auto read = [&] {
      stream.synchronize();
      for (RouteSamples& s : timed) {
        s.device_ms.clear();
        for (size_t i = 0; i < s.start.size(); ++i) s.device_ms.push_back(s.start[i].elapsed_time(s.stop[i]));
      }
    };
    auto fastest = [&]() -> const RouteSamples* {
      const RouteSamples* f = nullptr;
      for (const RouteSamples& s : timed) {
        if (!s.failed && (f == nullptr || s.cost() < f->cost())) f = &s;
      }
      return f;
    };
    if (!timed.empty()) {
      constexpr int kFirstRounds = 3, kMaxRounds = 15;
      const auto t0 = Clock::now();
      rounds(kFirstRounds);
      read();  // the one synchronisation
      const double spent = ms_since(t0);
      const RouteSamples* f = fastest();
      // More rounds while the time spent stays within ~20 calls of the fastest candidate (or 1 ms: a
      // product of ~10 us needs more than 3 samples to separate routes 20% apart).
      if (f != nullptr && spent > 0.0) {
        const double budget = std::max(20.0 * f->cost(), 1.0);
        const int more = std::min(kMaxRounds - kFirstRounds,
                                  static_cast<int>((budget - spent) / (spent / kFirstRounds)));
        if (more > 0) {
          rounds(more);
          read();
        }
      }
      if ((f = fastest()) != nullptr) best = f->route;
    }
  }
  tuning::TuningTable::global().decide(
      tuning::signature(p, dtype, a, tuning::b_layout(dense), tuning::device_id(values.device())), best);
  return best;
}

namespace {
std::string spmm_tune_cuda(const at::Tensor& crow, const at::Tensor& col, const at::Tensor& values,
                           const at::Tensor& dense) {
  const SpmmProblem p = check_spmm_args(crow, col, values, dense, std::nullopt, std::nullopt);
  const c10::cuda::CUDAGuard guard(values.device());
  checked_csr(crow, col, p.k, /*validate=*/true, "SpmmPlan");
  TORCH_CHECK(!capturing(), "spmm_tune: routes cannot be timed during CUDA graph capture");
  const auto a = analyze_csr(crow, col, p.k, AnalysisMode::kFinal);  // its decision is keyed on the real statistics
  return spmm_route_name(measure_spmm_route(p, crow, col, values, dense, *a));
}
}  // namespace

TORCH_LIBRARY_IMPL(sparsetorch, CUDA, m) { m.impl("spmm_tune", SPARSETORCH_CUDA_OP(spmm_tune_cuda)); }

}  // namespace cuda
}  // namespace sparsetorch
