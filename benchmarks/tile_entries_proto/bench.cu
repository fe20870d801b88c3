// Issue 19 prototype: pruned bf16 y = x @ W.T at N <= 16 with a 64-row warp tile.
//
// Standalone (nvcc -O3 -arch=sm_90 bench.cu -lcublas). It measures, in one run and against cuBLAS
// (what F.linear calls), three kernels on one skeleton:
//   null   - the W entries streamed by TMA into a per-warp ring, x loaded, MMAs issued, but no decode
//            (A fragments are a constant). The go/no-go bound of docs/research/issue19_spinfer_flashllm.md.
//   atoms  - decode: each round of 32 entries (slot << 16 | bf16) is scattered with one 16-bit shared store
//            per lane into a per-warp 64 x 64 tile held in fragment order; A fragments are read and the
//            tile reset in one `atomicExch` per register (lane-consecutive words, conflict-free).
//   none   - no W bytes at all: x, the MMAs and the reduction only (the skeleton's own cost).
//   lds    - the same scatter into a tile whose lane owns 4 consecutive words (one LDS.128 per fragment),
//            reset by scattering zeros to the same slots again (only the written ones).
// Work split: a thread-block cluster per 64 rows of W; the cluster's warps split the 64-column chunks,
// and reduce their partial sums through distributed shared memory in a fixed order (deterministic).
// Shapes: M and K multiples of 64 (the harness neither pads nor checks).
// x is read straight from [N, K] row-major: the k order inside a k16 step is permuted so that one 16-byte
// load per lane and token half gives the B fragments of two k16 steps (the host builds W's slots with
// the same permutation).
#include <cuda_bf16.h>
#include <cublas_v2.h>
#include <cooperative_groups.h>
#include <cstdio>
#include <cstdlib>
#include <cstdint>
#include <cmath>
#include <vector>
#include <algorithm>
#include <random>
#include <string>
#include <cstring>

#include "../proto_host.h"

namespace cg = cooperative_groups;

constexpr int TILE_WORDS = 2048;      // 64 x 64 bf16
constexpr int TRASH_WORDS = 32;       // padding entries land here, one word per bank
constexpr int MAX_STAGES = 8;

enum Decode { DECODE_NULL = 0, DECODE_ATOMS = 1, DECODE_LDS = 2, DECODE_NONE = 3 };  // NONE: no W bytes at all

struct Params {
  const uint32_t* entries;   // per tile, rounds of 32 entries: slot << 16 | bf16 bits
  const uint32_t* tile_off;  // [rowtiles * chunks + 1], in entries (multiples of 32)
  const __nv_bfloat16* x;    // [N, K]
  __nv_bfloat16* y;          // [N, M]
  int M, K, N, chunks, slices, wpb, stages, stage_cap;
  // Timing ablations (results are then wrong): 1 no x loads, 2 no MMAs, 4 no tiles, 8 no epilogue,
  // 16 no prologue, 32 epilogue = cluster barriers only, 64 epilogue reads only the warp's own partial.
  int ablate;
};

__device__ __forceinline__ uint32_t smem_u32(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void mbar_init(uint64_t* bar) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(smem_u32(bar)) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint64_t* bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(smem_u32(bar)), "r"(bytes)
               : "memory");
}
__device__ __forceinline__ bool mbar_try_wait(uint64_t* bar, uint32_t phase) {
  uint32_t ok;
  asm volatile(
      "{ .reg .pred p; mbarrier.try_wait.parity.shared::cta.b64 p, [%1], %2; selp.u32 %0, 1, 0, p; }"
      : "=r"(ok)
      : "r"(smem_u32(bar)), "r"(phase)
      : "memory");
  return ok != 0;
}
__device__ __forceinline__ void bulk_copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];" ::"r"(
          smem_u32(dst)),
      "l"(src), "r"(bytes), "r"(smem_u32(bar))
      : "memory");
}
__device__ __forceinline__ void mma_bf16(float (&c)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}

// Word of fragment register `reg` (a0..a3) of strip s, k16 step j, for `lane`, in each tile layout.
__host__ __device__ __forceinline__ int word_atoms(int s, int j, int reg, int lane) {
  return ((s * 4 + j) * 4 + reg) * 32 + lane;
}
__host__ __device__ __forceinline__ int word_lds(int s, int j, int reg, int lane) {
  return ((s * 4 + j) * 32 + lane) * 4 + reg;
}

// Shared memory of one warp: the entry ring, the 64 x 64 tile (+ trash words), the ring's barriers.
__host__ __device__ inline size_t warp_smem_bytes(int stages, int stage_cap) {
  return static_cast<size_t>(stages) * stage_cap * 4 + (TILE_WORDS + TRASH_WORDS) * 4 + MAX_STAGES * 8;
}

template <int NT, int DECODE>
__global__ void __launch_bounds__(256) tile_entries_kernel(const Params p) {
  extern __shared__ __align__(128) unsigned char smem[];
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  cg::cluster_group cluster = cg::this_cluster();
  const int rank = static_cast<int>(cluster.block_rank());
  const int rowtile = blockIdx.x / cluster.dim_blocks().x;
  const int slice = rank * p.wpb + warp;
  const int c0 = static_cast<int>(static_cast<long>(slice) * p.chunks / p.slices);
  const int c1 = static_cast<int>(static_cast<long>(slice + 1) * p.chunks / p.slices);
  const int ntiles = (p.ablate & 4) ? 0 : c1 - c0;
  const int g = lane >> 2, t = lane & 3;

  const size_t warp_bytes = warp_smem_bytes(p.stages, p.stage_cap);
  unsigned char* mine = smem + warp * warp_bytes;
  uint32_t* ring = reinterpret_cast<uint32_t*>(mine);
  uint32_t* tile = ring + static_cast<size_t>(p.stages) * p.stage_cap;
  uint64_t* bars = reinterpret_cast<uint64_t*>(tile + TILE_WORDS + TRASH_WORDS);

  if (!(p.ablate & 16))
    for (int w = lane; w < TILE_WORDS + TRASH_WORDS; w += 32) tile[w] = 0u;
  if (lane == 0 && !(p.ablate & 16)) {
    for (int s = 0; s < p.stages; ++s) mbar_init(&bars[s]);
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
  }
  __syncwarp();

  // Tile bounds: lane l holds the offset of tile l (one coalesced load); later tiles from global.
  const size_t tile0 = static_cast<size_t>(rowtile) * p.chunks + c0;
  const uint32_t off_win = (lane <= ntiles && !(p.ablate & 16)) ? __ldg(&p.tile_off[tile0 + lane]) : 0u;
  auto bound = [&](int i) -> uint32_t {  // warp-uniform i
    return i < 32 ? __shfl_sync(0xffffffffu, off_win, i) : __ldg(&p.tile_off[tile0 + i]);
  };
  auto issue = [&](int i, uint32_t b, uint32_t e) {  // lane 0: copy tile i into its stage
    const int st = i % p.stages;
    const uint32_t bytes = (e - b) * 4u;
    mbar_expect_tx(&bars[st], bytes);
    if (bytes) bulk_copy(ring + static_cast<size_t>(st) * p.stage_cap, p.entries + b, bytes, &bars[st]);
  };
  if (DECODE != DECODE_NONE)
    for (int i = 0; i < p.stages && i < ntiles; ++i) {
      const uint32_t b = bound(i), e = bound(i + 1);
      if (lane == 0) issue(i, b, e);
    }

  float acc[4][NT][4];
#pragma unroll
  for (int s = 0; s < 4; ++s)
#pragma unroll
    for (int h = 0; h < NT; ++h)
#pragma unroll
      for (int c = 0; c < 4; ++c) acc[s][h][c] = 0.f;

  // x fragments: per token half h and k32 half kk, one uint4 = k 8t..8t+7 of token g + 8h (zeros past N).
  auto load_x = [&](int chunk, uint4 (&xr)[2][NT]) {
#pragma unroll
    for (int kk = 0; kk < 2; ++kk)
#pragma unroll
      for (int h = 0; h < NT; ++h) {
        const int tok = g + 8 * h;
        const size_t k = static_cast<size_t>(chunk) * 64 + kk * 32 + t * 8;
        xr[kk][h] = (tok < p.N && !(p.ablate & 1))
                        ? __ldg(reinterpret_cast<const uint4*>(p.x + static_cast<size_t>(tok) * p.K + k))
                        : make_uint4(0, 0, 0, 0);
      }
  };
  uint4 xr[2][NT], xn[2][NT], xnn[2][NT];  // x of tiles i, i + 1, i + 2
  if (ntiles > 0) load_x(c0, xr);
  if (ntiles > 1) load_x(c0 + 1, xn);

  unsigned short* tile16 = reinterpret_cast<unsigned short*>(tile);
  for (int i = 0; i < ntiles; ++i) {
    const int st = i % p.stages;
    const uint32_t phase = (i / p.stages) & 1u;
    const uint32_t b = bound(i), e = bound(i + 1);
    const bool refill = i + p.stages < ntiles;
    const uint32_t nb = refill ? bound(i + p.stages) : 0u, ne = refill ? bound(i + p.stages + 1) : 0u;
    const int rounds = static_cast<int>((e - b) >> 5);
    const uint32_t* stage = ring + static_cast<size_t>(st) * p.stage_cap;
    if (i + 2 < ntiles) load_x(c0 + i + 2, xnn);
    if (DECODE != DECODE_NONE)
      while (!mbar_try_wait(&bars[st], phase)) {
      }
    if (DECODE == DECODE_ATOMS || DECODE == DECODE_LDS) {
#pragma unroll 4
      for (int r = 0; r < rounds; ++r) {
        const uint32_t en = stage[r * 32 + lane];
        tile16[en >> 16] = static_cast<unsigned short>(en & 0xffffu);
      }
    }
    __syncwarp();
    if ((DECODE == DECODE_ATOMS || DECODE == DECODE_NULL) && lane == 0 && refill) {
      asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
      issue(i + p.stages, nb, ne);
    }
#pragma unroll
    for (int s = 0; s < 4; ++s) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        uint32_t a[4];
        if (DECODE == DECODE_NULL || DECODE == DECODE_NONE) {
          a[0] = a[1] = a[2] = a[3] = 0x3f803f80u ^ static_cast<uint32_t>(s * 4 + j);
        } else if (DECODE == DECODE_ATOMS) {
#pragma unroll
          for (int r = 0; r < 4; ++r) a[r] = atomicExch(&tile[word_atoms(s, j, r, 0) + lane], 0u);
        } else {
          const uint4 v = *reinterpret_cast<const uint4*>(&tile[word_lds(s, j, 0, lane)]);
          a[0] = v.x; a[1] = v.y; a[2] = v.z; a[3] = v.w;
        }
        const int kk = j >> 1, q = j & 1;
#pragma unroll
        for (int h = 0; h < NT; ++h) {
          const uint32_t b0 = q ? xr[kk][h].z : xr[kk][h].x;
          const uint32_t b1 = q ? xr[kk][h].w : xr[kk][h].y;
          if (!(p.ablate & 2)) mma_bf16(acc[s][h], a[0], a[1], a[2], a[3], b0, b1);
        }
      }
    }
    if (DECODE == DECODE_LDS) {
      __syncwarp();
#pragma unroll 4
      for (int r = 0; r < rounds; ++r) {
        const uint32_t en = stage[r * 32 + lane];
        tile16[en >> 16] = 0;
      }
      __syncwarp();
      if (lane == 0 && refill) {
        asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
        issue(i + p.stages, nb, ne);
      }
    }
    __syncwarp();
    if (i + 1 < ntiles) {
#pragma unroll
      for (int kk = 0; kk < 2; ++kk)
#pragma unroll
        for (int h = 0; h < NT; ++h) {
          xr[kk][h] = xn[kk][h];
          xn[kk][h] = xnn[kk][h];
        }
    }
  }

  // Partials into this warp's tile area (lane-consecutive), then a fixed-order sum over the cluster.
  if (p.ablate & 8) return;
  float* part = reinterpret_cast<float*>(tile);
  __syncwarp();
#pragma unroll
  for (int s = 0; s < 4; ++s)
#pragma unroll
    for (int h = 0; h < NT; ++h)
#pragma unroll
      for (int c = 0; c < 4; ++c) part[((s * NT + h) * 4 + c) * 32 + lane] = acc[s][h][c];
  cluster.sync();
  if (p.ablate & 32) { cluster.sync(); return; }
  constexpr int NREG = 16 * NT;
  const size_t tile_byte_off = static_cast<size_t>(p.stages) * p.stage_cap * 4;
  for (int r = slice; r < NREG; r += p.slices) {
    // Fixed order: slice 0, 1, ... (block-major). One mapped base per block, no divisions.
    float sum = 0.f;
    for (int blk = 0; blk < static_cast<int>(cluster.num_blocks()); ++blk) {
      const unsigned char* base = (p.ablate & 64) ? smem : cluster.map_shared_rank(smem, blk);
      base += tile_byte_off + r * 128 + lane * 4;
#pragma unroll 4
      for (int w2 = 0; w2 < p.wpb; ++w2) sum += *reinterpret_cast<const float*>(base + w2 * warp_bytes);
    }
    const int s = r / (NT * 4), h = (r / 4) % NT, c = r % 4;
    const int row = rowtile * 64 + 16 * s + g + 8 * (c >> 1);
    const int tok = 8 * h + 2 * t + (c & 1);
    if (tok < p.N && row < p.M) p.y[static_cast<size_t>(tok) * p.M + row] = __float2bfloat16(sum);
  }
  cluster.sync();
}

__global__ void reference_kernel(const __nv_bfloat16* W, const __nv_bfloat16* x, double* y, int M, int K, int N) {
  const int row = blockIdx.x * blockDim.y + threadIdx.y;
  if (row >= M) return;
  for (int n = 0; n < N; ++n) {
    double s = 0;
    for (int k = threadIdx.x; k < K; k += 32)
      s += static_cast<double>(__bfloat162float(W[static_cast<size_t>(row) * K + k])) *
           static_cast<double>(__bfloat162float(x[static_cast<size_t>(n) * K + k]));
    for (int o = 16; o; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
    if (threadIdx.x == 0) y[static_cast<size_t>(n) * M + row] = s;
  }
}

// Read-only L2 flush: leaves L2 full of clean lines (a memset flush leaves it dirty, and the next kernel then
// pays the write-backs of what it evicts).
__global__ void read_flush_kernel(const uint4* p, size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x; i < n; i += static_cast<size_t>(gridDim.x) * blockDim.x)
    acc ^= p[i].x;
  if (acc == 0x12345678u) *sink = acc;
}

__global__ void empty_kernel() {}

// Streams `n` 16-byte words once (what any kernel reading a weight of that size must at least do).
__global__ void stream_kernel(const uint4* p, size_t n, unsigned* sink) {
  unsigned acc = 0;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  size_t i = blockIdx.x * static_cast<size_t>(blockDim.x) + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    const uint4 a = __ldcs(p + i), b = __ldcs(p + i + stride), c = __ldcs(p + i + 2 * stride), d = __ldcs(p + i + 3 * stride);
    acc ^= a.x ^ b.y ^ c.z ^ d.w;
  }
  for (; i < n; i += stride) acc ^= __ldcs(p + i).x;
  if (acc == 0x12345678u) *sink = acc;
}

// ---------------------------------------------------------------------------------------------- host
struct Format {
  std::vector<uint32_t> entries, offsets;
  size_t nnz = 0, padded = 0, max_tile = 0;
  double conflict_wf = 0;  // scatter wavefronts per round (1 = conflict-free), mean
};

// Entries of each 64 x 64 tile, ordered into rounds of 32 whose target banks are as distinct as the tile
// allows (fullest bank first), padded to whole rounds with zero entries into trash words.
static Format build_format(const std::vector<uint16_t>& W, int M, int K, int layout) {
  Format f;
  const int rowtiles = (M + 63) / 64, chunks = (K + 63) / 64;
  f.offsets.push_back(0);
  std::vector<std::vector<uint32_t>> bank(32);
  size_t rounds_total = 0;
  double wf_total = 0;
  for (int rt = 0; rt < rowtiles; ++rt)
    for (int ch = 0; ch < chunks; ++ch) {
      for (auto& b : bank) b.clear();
      size_t n = 0;
      for (int r = 0; r < 64; ++r) {
        const int row = rt * 64 + r;
        if (row >= M) break;
        for (int cc = 0; cc < 64; ++cc) {
          const int col = ch * 64 + cc;
          if (col >= K) break;
          const uint16_t v = W[static_cast<size_t>(row) * K + col];
          if ((v & 0x7fffu) == 0) continue;
          const int s = r / 16, rr = r % 16, gg = rr % 8, rowhi = rr / 8;
          const int kk = cc / 32, c5 = cc % 32, tt = c5 / 8, q = (c5 % 8) / 4, hi = (c5 % 4) / 2, half = c5 % 2;
          const int j = 2 * kk + q, reg = rowhi + 2 * hi, ln = gg * 4 + tt;
          const int word = layout == DECODE_LDS ? word_lds(s, j, reg, ln) : word_atoms(s, j, reg, ln);
          const uint32_t slot = static_cast<uint32_t>(word * 2 + half);
          bank[word % 32].push_back(slot << 16 | v);
          ++n;
        }
      }
      f.nnz += n;
      const size_t rounds = (n + 31) / 32;
      for (size_t rd = 0; rd < rounds; ++rd) {
        std::vector<int> order(32);
        for (int b = 0; b < 32; ++b) order[b] = b;
        std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return bank[a].size() > bank[b].size(); });
        std::vector<uint32_t> round;
        int used[32] = {0};
        for (int pass = 0; round.size() < 32; ++pass) {
          bool any = false;
          for (int b : order) {
            if (round.size() == 32) break;
            if (static_cast<int>(bank[b].size()) > 0 && used[b] == pass) {
              round.push_back(bank[b].back());
              bank[b].pop_back();
              ++used[b];
              any = true;
            }
          }
          if (!any) break;
        }
        int maxuse = 0;
        for (int b = 0; b < 32; ++b) maxuse = std::max(maxuse, used[b]);
        wf_total += maxuse;
        // Padding: zero values into trash words of unused banks.
        for (int b = 0; b < 32 && round.size() < 32; ++b)
          if (!used[b]) round.push_back(static_cast<uint32_t>((TILE_WORDS + b) * 2) << 16);
        for (uint32_t en : round) f.entries.push_back(en);
      }
      rounds_total += rounds;
      f.max_tile = std::max(f.max_tile, rounds * 32);
      f.offsets.push_back(static_cast<uint32_t>(f.entries.size()));
    }
  f.padded = f.entries.size();
  f.conflict_wf = rounds_total ? wf_total / rounds_total : 0;
  return f;
}

struct Case {
  int M, K;
  double sparsity;
};

template <int NT, int DECODE>
static void launch(const Params& p, int cluster, size_t smem_bytes, cudaStream_t stream) {
  static bool attr = false;
  if (!attr) {
    CK(cudaFuncSetAttribute(tile_entries_kernel<NT, DECODE>, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024));
    CK(cudaFuncSetAttribute(tile_entries_kernel<NT, DECODE>, cudaFuncAttributeNonPortableClusterSizeAllowed, 1));
    attr = true;
  }
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3((p.M + 63) / 64 * cluster);
  cfg.blockDim = dim3(32 * p.wpb);
  cfg.dynamicSmemBytes = smem_bytes;
  cfg.stream = stream;
  cudaLaunchAttribute at[1];
  at[0].id = cudaLaunchAttributeClusterDimension;
  at[0].val.clusterDim.x = cluster;
  at[0].val.clusterDim.y = 1;
  at[0].val.clusterDim.z = 1;
  cfg.attrs = at;
  cfg.numAttrs = 1;
  CK(cudaLaunchKernelEx(&cfg, tile_entries_kernel<NT, DECODE>, p));
}

static void launch_any(int nt, int decode, const Params& p, int cluster, size_t smem, cudaStream_t s) {
  if (nt == 1) {
    if (decode == 0) launch<1, 0>(p, cluster, smem, s);
    else if (decode == 1) launch<1, 1>(p, cluster, smem, s);
    else if (decode == 2) launch<1, 2>(p, cluster, smem, s);
    else launch<1, 3>(p, cluster, smem, s);
  } else {
    if (decode == 0) launch<2, 0>(p, cluster, smem, s);
    else if (decode == 1) launch<2, 1>(p, cluster, smem, s);
    else if (decode == 2) launch<2, 2>(p, cluster, smem, s);
    else launch<2, 3>(p, cluster, smem, s);
  }
}

int main(int argc, char** argv) {
  // Environment: REPS, SHAPES (11008x4096,...), SPS (0.9,...), NS (1,8,16), DECODES (0,1,2,3),
  // CFGS (cluster:warps:stages,...; default by shape), FLUSH (memset | read).
  const int reps = atoi(env_list("REPS", "20")[0].c_str());
  const bool read_flush = env_list("FLUSH", "memset")[0] == "read";
  unsigned* sink;
  CK(cudaMalloc(&sink, 4));
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  printf("device %s, %d SMs, smem/SM %zu KB\n", prop.name, prop.multiProcessorCount, prop.sharedMemPerMultiprocessor / 1024);
  BenchSetup setup;
  cudaStream_t stream = setup.stream;
  const size_t flush_bytes = BenchSetup::kFlushBytes;
  void* flush = setup.flush;

  // Copy rate (read + write bytes over time), for the floors.
  double copy_gbs;
  {
    void *a, *b;
    const size_t sz = 1ull << 30;
    CK(cudaMalloc(&a, sz));
    CK(cudaMalloc(&b, sz));
    std::vector<float> ts;
    for (int i = 0; i < 6; ++i) {
      ts.push_back(setup.timed_us([&] { cudaMemcpyAsync(b, a, sz, cudaMemcpyDeviceToDevice, stream); }) * 1e-3f);
    }
    std::sort(ts.begin(), ts.end());
    copy_gbs = 2.0 * sz / (ts[3] * 1e-3) / 1e9;
    cudaFree(a);
    cudaFree(b);
  }
  printf("copy rate %.0f GB/s (read + write)\n", copy_gbs);

  if (getenv("FLOORS")) {
    // Floors under the same timing and flush as the kernels: an empty launch, and streaming reads of
    // the 90% / 70% / 50% entry bytes and of a dense 11008 x 4096 bf16 weight.
    void* buf;
    const size_t maxb = 96ull << 20;
    CK(cudaMalloc(&buf, maxb));
    CK(cudaMemset(buf, 1, maxb));
    for (const bool rf : {false, true}) {
      for (double mb : {0.0, 9.0, 18.7, 54.8, 90.2}) {
        std::vector<float> ts;
        for (int rep = 0; rep < reps + 3; ++rep) {
          if (rf) read_flush_kernel<<<4 * prop.multiProcessorCount, 512, 0, stream>>>(static_cast<const uint4*>(flush), flush_bytes / 16, sink);
          else CK(cudaMemsetAsync(flush, rep & 0xff, flush_bytes, stream));
          const float us = setup.timed_us([&] {
            if (mb == 0) empty_kernel<<<1, 32, 0, stream>>>();
            else stream_kernel<<<prop.multiProcessorCount * 8, 512, 0, stream>>>(static_cast<const uint4*>(buf), static_cast<size_t>(mb * 1e6 / 16), sink);
          });
          if (rep >= 3) ts.push_back(us);
        }
        std::sort(ts.begin(), ts.end());
        printf("floor flush=%s %5.1f MB: %.1f us (%.0f GB/s)\n", rf ? "read" : "memset", mb, ts[ts.size() / 2], mb * 1e3 / ts[ts.size() / 2]);
      }
    }
    cudaFree(buf);
  }

  std::vector<Case> cases;
  for (const auto& sh : env_list("SHAPES", "11008x4096,4096x11008"))
    for (const auto& sp : env_list("SPS", "0.5,0.7,0.9,0.95"))
      cases.push_back({atoi(sh.c_str()), atoi(sh.c_str() + sh.find('x') + 1), atof(sp.c_str())});
  std::vector<int> Ns;
  for (const auto& n : env_list("NS", "1,8,16")) Ns.push_back(atoi(n.c_str()));
  std::vector<int> decodes;
  for (const auto& d : env_list("DECODES", "0,1,3")) decodes.push_back(atoi(d.c_str()));
  printf("flush: %s\n", read_flush ? "read (clean L2)" : "memset (dirty L2, as triton's do_bench)");
  std::mt19937_64 rng(1234);
  printf("%-11s %5s %3s %-6s %8s %8s %7s %7s %8s %9s %s\n", "shape", "sp", "N", "kernel", "us", "dense_us", "x_dense",
         "floor", "of_floor", "err", "config");
  for (const Case& cs : cases) {
    char shape[32];
    snprintf(shape, sizeof shape, "%dx%d", cs.M, cs.K);
    const int M = cs.M, K = cs.K;
    std::vector<uint16_t> W(static_cast<size_t>(M) * K);
    std::uniform_real_distribution<float> U(-1.f, 1.f), P(0.f, 1.f);
    for (auto& w : W) {
      const float v = U(rng);
      w = P(rng) < cs.sparsity ? 0 : f2bf(v == 0.f ? 0.5f : v);
    }
    Format fa = build_format(W, M, K, DECODE_ATOMS), fl = build_format(W, M, K, DECODE_LDS);
    const int rowtiles = (M + 63) / 64, chunks = (K + 63) / 64;
    __nv_bfloat16 *dW, *dx, *dy, *dyd;
    double* dref;
    uint32_t *dEa, *dOa, *dEl, *dOl;
    const int NMAX = 16;
    CK(cudaMalloc(&dW, W.size() * 2));
    CK(cudaMemcpy(dW, W.data(), W.size() * 2, cudaMemcpyHostToDevice));
    std::vector<uint16_t> X(static_cast<size_t>(NMAX) * K);
    for (auto& v : X) v = f2bf(U(rng));
    CK(cudaMalloc(&dx, X.size() * 2));
    CK(cudaMemcpy(dx, X.data(), X.size() * 2, cudaMemcpyHostToDevice));
    CK(cudaMalloc(&dy, static_cast<size_t>(NMAX) * M * 2));
    CK(cudaMalloc(&dyd, static_cast<size_t>(NMAX) * M * 2));
    CK(cudaMalloc(&dref, static_cast<size_t>(NMAX) * M * 8));
    auto up = [&](const std::vector<uint32_t>& v, uint32_t** d) {
      CK(cudaMalloc(d, v.size() * 4));
      CK(cudaMemcpy(*d, v.data(), v.size() * 4, cudaMemcpyHostToDevice));
    };
    up(fa.entries, &dEa);
    up(fa.offsets, &dOa);
    up(fl.entries, &dEl);
    up(fl.offsets, &dOl);
    reference_kernel<<<(M + 7) / 8, dim3(32, 8)>>>(dW, dx, dref, M, K, NMAX);
    CK(cudaDeviceSynchronize());
    std::vector<double> ref(static_cast<size_t>(NMAX) * M);
    CK(cudaMemcpy(ref.data(), dref, ref.size() * 8, cudaMemcpyDeviceToHost));
    printf("# %s sparsity %.2f: nnz %zu, padded %zu (+%.1f%%), max tile %zu entries, scatter %.2f wf/round (atoms) %.2f (lds)\n",
           shape, cs.sparsity, fa.nnz, fa.padded, 100.0 * (fa.padded - fa.nnz) / std::max<size_t>(fa.nnz, 1), fa.max_tile,
           fa.conflict_wf, fl.conflict_wf);

    for (int N : Ns) {
      const int nt = N <= 8 ? 1 : 2;
      // Configurations: (cluster, warps per block).
      struct Variant { std::string name; int decode, cluster, wpb, stages, ablate; };
      std::vector<Variant> vars;
      for (const auto& c : env_list("CFGS", rowtiles >= 128 ? "4:2:4,2:4:4,1:8:2,4:2:2" : "8:2:4,4:4:4,2:8:2"))
        for (int dec : decodes) {
          int cl, w, st, ab = 0;
          sscanf(c.c_str(), "%d:%d:%d:%d", &cl, &w, &st, &ab);
          vars.push_back({"", dec, cl, w, st, ab});
        }
      std::vector<std::vector<float>> times(vars.size() + 1);
      std::vector<double> errs(vars.size(), 0);
      std::vector<Params> ps(vars.size());
      std::vector<size_t> smems(vars.size());
      for (size_t v = 0; v < vars.size(); ++v) {
        const Format& f = vars[v].decode == DECODE_LDS ? fl : fa;
        Params p;
        p.entries = vars[v].decode == DECODE_LDS ? dEl : dEa;
        p.tile_off = vars[v].decode == DECODE_LDS ? dOl : dOa;
        p.x = dx;
        p.y = dy;
        p.M = M; p.K = K; p.N = N; p.chunks = chunks;
        p.wpb = vars[v].wpb;
        p.slices = vars[v].cluster * vars[v].wpb;
        p.stages = vars[v].stages;
        p.stage_cap = static_cast<int>(f.max_tile);
        p.ablate = vars[v].ablate;
        smems[v] = warp_smem_bytes(p.stages, p.stage_cap) * p.wpb;
        ps[v] = p;
        char nm[64];
        snprintf(nm, sizeof nm, "%s", vars[v].decode == 0 ? "null" : vars[v].decode == 1 ? "atoms" : vars[v].decode == 2 ? "lds" : "none");
        if (vars[v].ablate) snprintf(nm + strlen(nm), sizeof nm - strlen(nm), "-a%d", vars[v].ablate);
        vars[v].name = nm;
        if (smems[v] > 200 * 1024) { errs[v] = -1; continue; }
        if (N == Ns[0] && cs.sparsity >= 0) {
          cudaLaunchConfig_t cfg = {};
          cfg.gridDim = dim3(rowtiles * vars[v].cluster);
          cfg.blockDim = dim3(32 * p.wpb);
          cfg.dynamicSmemBytes = smems[v];
          cudaLaunchAttribute at[1];
          at[0].id = cudaLaunchAttributeClusterDimension;
          at[0].val.clusterDim.x = vars[v].cluster; at[0].val.clusterDim.y = 1; at[0].val.clusterDim.z = 1;
          cfg.attrs = at; cfg.numAttrs = 1;
          int active = -1;
          launch_any(nt, vars[v].decode, p, vars[v].cluster, smems[v], stream);  // sets the attributes
          CK(cudaStreamSynchronize(stream));
          if (nt == 2 && vars[v].decode == 1) cudaOccupancyMaxActiveClusters(&active, tile_entries_kernel<2, 1>, &cfg);
          if (nt == 1 && vars[v].decode == 1) cudaOccupancyMaxActiveClusters(&active, tile_entries_kernel<1, 1>, &cfg);
          if (active >= 0) printf("# config %d:%d:%d smem %zu: %d clusters of %d can be active, grid has %d\n", vars[v].cluster, p.wpb, p.stages, smems[v], active, vars[v].cluster, rowtiles);
        }
        // correctness
        CK(cudaMemset(dy, 0, static_cast<size_t>(NMAX) * M * 2));
        launch_any(nt, vars[v].decode, p, vars[v].cluster, smems[v], stream);
        CK(cudaStreamSynchronize(stream));
        if (vars[v].decode == 1 || vars[v].decode == 2) {
          std::vector<uint16_t> yo(static_cast<size_t>(N) * M);
          CK(cudaMemcpy(yo.data(), dy, yo.size() * 2, cudaMemcpyDeviceToHost));
          double num = 0, den = 0;
          for (size_t i = 0; i < yo.size(); ++i) {
            uint32_t u = static_cast<uint32_t>(yo[i]) << 16;
            float f;
            memcpy(&f, &u, 4);
            const double d = f - ref[i];
            num += d * d;
            den += ref[i] * ref[i];
          }
          errs[v] = std::sqrt(num / std::max(den, 1e-300));
        }
      }
      for (int rep = 0; rep < reps + 3; ++rep) {
        for (size_t v = 0; v <= vars.size(); ++v) {
          if (v < vars.size() && errs[v] < 0) continue;
          if (read_flush) read_flush_kernel<<<4 * prop.multiProcessorCount, 512, 0, stream>>>(static_cast<const uint4*>(flush), flush_bytes / 16, sink);
          else CK(cudaMemsetAsync(flush, rep & 0xff, flush_bytes, stream));
          const float us = setup.timed_us([&] {
            if (v == vars.size()) setup.dense_bf16(M, N, K, dW, dx, dyd);
            else launch_any(nt, vars[v].decode, ps[v], vars[v].cluster, smems[v], stream);
          });
          if (rep >= 3) times[v].push_back(us);
        }
      }
      CK(cudaGetLastError());
      auto med = [](std::vector<float> t) { std::sort(t.begin(), t.end()); return t.empty() ? 0.f : t[t.size() / 2]; };
      const double dense_us = med(times[vars.size()]);
      for (size_t v = 0; v < vars.size(); ++v) {
        if (errs[v] < 0) { printf("%-11s %5.2f %3d %-6s  (smem %zu too large)\n", shape, cs.sparsity, N, vars[v].name.c_str(), smems[v]); continue; }
        const Format& f = vars[v].decode == DECODE_LDS ? fl : fa;
        const double bytes = f.padded * 4.0 + f.offsets.size() * 4.0 + static_cast<double>(N) * K * 2 + static_cast<double>(N) * M * 2;
        const double floor_us = bytes / (copy_gbs * 1e9) * 1e6;  // read-only stream at the copy's total rate
        const double us = med(times[v]);
        printf("%-11s %5.2f %3d %-6s %8.1f %8.1f %7.2f %7.1f %8.2f %9.2e cluster %d x %d warps, %d stages, smem %zu\n", shape,
               cs.sparsity, N, vars[v].name.c_str(), us, dense_us, dense_us / us, floor_us, floor_us / us, errs[v],
               vars[v].cluster, vars[v].wpb, vars[v].stages, smems[v]);
      }
      fflush(stdout);
    }
    cudaFree(dW); cudaFree(dx); cudaFree(dy); cudaFree(dyd); cudaFree(dref);
    cudaFree(dEa); cudaFree(dOa); cudaFree(dEl); cudaFree(dOl);
  }
  return 0;
}
