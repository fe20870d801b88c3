#include "bitmap_stream_kernel.cuh"
extern "C" int bms_launch(int bf16, const void* bitmaps, const void* offsets, const void* values, long long nvalues,
                          const void* x, long long ldx, int kx, void* out, const void* bias, int m, int n, int strips,
                          int chunks, int act, float slope, int splits, int sms, long long stream, int prefetch) {
  bms::Params p{};
  p.bitmaps = static_cast<const uint64_t*>(bitmaps);
  p.offsets = static_cast<const int*>(offsets);
  p.values = static_cast<const uint16_t*>(values);
  p.nvalues = nvalues;
  p.x = static_cast<const uint16_t*>(x);
  p.ldx = ldx;
  p.kx = kx;
  p.out = static_cast<uint16_t*>(out);
  p.bias = static_cast<const uint16_t*>(bias);
  p.prefetch = prefetch;
  p.m = m, p.n = n, p.strips = strips, p.chunks = chunks, p.act = act, p.slope = slope;
  return static_cast<int>(bms::launch(bf16 != 0, p, splits, sms, reinterpret_cast<cudaStream_t>(stream)));
}
