// Error codes written by csr_check (CPU and CUDA alike); sparsetorch/_validate.py turns a code
// into the message. The op returns int64 [code, batch, position, offending value].
#pragma once

namespace sparsetorch {
enum CsrCheckCode : int64_t {
  kCsrOk = 0,
  kCrowFirstNotZero = 1,   // crow[b, 0] != 0                         position 0
  kCrowDecreasing = 2,     // crow[b, r+1] < crow[b, r]               position r+1
  kCrowLastMismatch = 3,   // unbatched: crow[-1] != nnz; batched: crow[b, -1] > L   position m
  kColOutOfRange = 4,      // col[b, j] < 0 or >= ncols                position j
};
}  // namespace sparsetorch
