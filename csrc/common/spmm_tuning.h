// The autotuner's bookkeeping: matrix signatures and the global tuning table (docs/tuning.md).
//
// "auto" keys what it learns on a SIGNATURE of the problem -- dtype, B's width and layout, the batch
// layout, log2 buckets of the shape and of the stored entries, the longest row's bin and the shape of
// the row-length histogram, and the device's name -- not on one matrix, so a stream of similar matrices
// (mini-batch subgraphs, one graph's layers) tunes once. While a signature is undecided, each "auto"
// call on a matrix of that signature runs the next candidate route as the real call and is timed
// (csrc/cuda/spmm_autotune.cu records events around it and reads them later, never with a sync); the
// samples come back here, and once every surviving candidate has enough of them the signature maps to
// the fastest route. The table is bounded (least recently used signatures dropped first) and
// thread-safe. This file is pure C++ (no CUDA): it is compiled and unit-tested on the CPU too
// (the test hooks sparsetorch_testing::spmm_tuning_next / spmm_tuning_record, csrc/testing_ops.cpp,
// tests/test_tuning.py).
#pragma once

#include <ATen/ATen.h>

#include <array>
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "common/checks.h"
#include "common/csr_analysis.h"

namespace sparsetorch {
namespace tuning {

// Bumped whenever the fields below or their buckets change: a cache file written with another layout
// is ignored (sparsetorch/tuning.py keys its entries on it).
constexpr int64_t kSignatureVersion = 1;

// The signature's fields, in this order (sparsetorch/tuning.py names them the same way).
enum Field : int {
  kDtype = 0,       // at::ScalarType of values and B
  kWidth,           // n, B's columns (exact: the routes' rules switch at exact widths)
  kBatchFlags,      // 1: pattern batched, 2: values batched, 4: B batched, 8: output batched
  kBatchBucket,     // log2 bucket of the batch count (0 for one matrix)
  kBLayout,         // 0: B row-major, rows 16-byte aligned; 1: row-major, unaligned; 2: other strides
  kRowsBucket,      // log2 bucket of the rows per matrix (m)
  kColsBucket,      // log2 bucket of the columns (k)
  kEntriesBucket,   // log2 bucket of the stored entries per pattern
  kLongestRowBin,   // 0 for no entries, else 1 + the csr_stats bin of the longest row
  kShare64,         // share of the entries in rows of >= 64 entries, quantised (share_level)
  kShare256,        // ... >= 256
  kShare4096,       // ... >= 4096
  kEmptyShare,      // share of empty rows, quantised (share_level)
  kFields
};

// 0 for 0, else 1 + floor(log2(v)): 1 -> 1, 2..3 -> 2, 4..7 -> 3, ...
int64_t log2_bucket(int64_t v);
// A share in [0, 1] as 0: < 2%, 1: < 10%, 2: < 50%, 3: >= 50%. (2% is the split route's rule on
// the share in rows of >= 4096 entries.)
int64_t share_level(double share);

struct SpmmSignature {
  int32_t device = 0;  // tuning_device_id of the device's name
  std::array<int64_t, kFields> f{};
  bool operator==(const SpmmSignature& o) const { return device == o.device && f == o.f; }
};

// A signature given as a device name and kFields values (a cache file, a test hook); `what` names the
// caller in the ValueError raised for a wrong count.
SpmmSignature signature_from_fields(const std::string& device, c10::IntArrayRef fields, const char* what);

// The device names signatures are keyed on, interned to small ids (names, not indices: two GPUs of one
// model share decisions, and a cache file from another model never matches).
int32_t device_id(const std::string& name);
std::string device_name(int32_t id);
// The id of a tensor's device: "cpu" for the CPU; for a CUDA device the name its namer gives
// (registered by the CUDA build, spmm_autotune.cu), else "cuda:<index>".
int32_t device_id(const at::Device& device);
using CudaDeviceNamer = std::string (*)(c10::DeviceIndex);
void set_cuda_device_namer(CudaDeviceNamer namer);

// B's layout as the routes see it (kBLayout).
int64_t b_layout(const at::Tensor& dense);

// O(1) from the problem and the matrix's analysis (its histogram in csr_stats layout); no device work.
SpmmSignature signature(const SpmmProblem& p, at::ScalarType dtype, const CsrAnalysis& a, int64_t b_layout,
                        int32_t device);

// The work of one product, for comparing samples of different matrices of one signature (their sizes
// differ within a factor of about 2 per bucket): (entries + rows) * n over all batches.
double product_work(const SpmmProblem& p, const CsrAnalysis& a);

// --- the table ------------------------------------------------------------------------------------

constexpr int kWarmupSamples = 1;   // the first sample of each candidate is discarded (cold code, workspaces)
constexpr int kSamples = 3;         // samples per surviving candidate before deciding (their minimum)
constexpr double kPruneFactor = 2.0;  // after one sample each, candidates above this times the best are dropped
                                      // (never the rules' route)
constexpr int kMaxSkips = 16;       // a candidate the signature's matrices keep not offering is dropped
constexpr int64_t kDefaultCapacity = 4096;

struct TuningChoice {
  SpmmBackend route;
  bool sample = false;  // this call is a sample: time it and report record() (or lost() / fail())
};

// One signature's state, as exported (tuning_table() in Python).
struct CandidateView {
  SpmmBackend route;
  int issued = 0;               // samples handed out (warm-up included)
  std::vector<double> costs;    // counted samples' costs (ms, normalised to the signature's first work)
  bool dropped = false;         // pruned, failed or never offered
  bool failed = false;
};
struct EntryView {
  SpmmSignature sig;
  std::optional<SpmmBackend> decided;
  std::vector<CandidateView> candidates;
};

class TuningTable {
 public:
  static TuningTable& global();

  // The decided route of a signature (nullopt while undecided or unknown); marks it recently used.
  std::optional<SpmmBackend> decided(const SpmmSignature& sig);

  // What a call of this signature runs. `candidates`: the routes this matrix can take, the rules'
  // route first. Decided: its route (when among `candidates`, else the rules'), no sample. `tune`
  // false (autotune off, graph capture): the decided route or the rules', nothing created. Else the
  // signature is created if new and the next candidate in rotation is handed out as a sample; when
  // every needed sample is already in flight, the best route so far, no sample.
  TuningChoice next(const SpmmSignature& sig, const std::vector<SpmmBackend>& candidates, bool tune);

  // A sample of `route` came back: its device and host milliseconds and its product's work.
  void record(const SpmmSignature& sig, SpmmBackend route, double device_ms, double host_ms, double work);
  // A sample handed out will never come back (no event free, an event error): hand it out again later.
  void lost(const SpmmSignature& sig, SpmmBackend route);
  // The route raised on this signature's matrix (out of memory, ...): no longer a candidate.
  void fail(const SpmmSignature& sig, SpmmBackend route);
  // Decided from outside (an explicit measurement, SpmmPlan; a cache file with overwrite).
  void decide(const SpmmSignature& sig, SpmmBackend route, bool overwrite = true);

  std::vector<EntryView> entries(bool decided_only);
  void clear();
  int64_t size();
  int64_t decided_count();
  // Sets the bound (> 0; least recently used signatures are dropped beyond it); returns the old one.
  int64_t set_capacity(int64_t capacity);
  int64_t capacity();
  // Bumped by every decision, import and clear: a cache is saved only when it moved.
  int64_t generation();

 private:
  TuningTable() = default;
  struct Impl;
  Impl& impl();
};

// Samples still in flight on the GPU (events not yet read), after reading those that are ready. The
// CUDA build registers the reader (spmm_autotune.cu); without it, 0.
using PendingPoller = int64_t (*)();
void set_pending_poller(PendingPoller poller);
int64_t poll_pending();

}  // namespace tuning
}  // namespace sparsetorch
