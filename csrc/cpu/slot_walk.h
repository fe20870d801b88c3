// The slot layout's entries as the CPU kernels read them (slot_linear, slot_to_dense): the offsets checked up
// front, then every group's entries decoded to their (row, column) of W and checked as they are read
// (IndexError naming the entry: a slot past 1023, a position outside W, a banded layout's padding strip
// included, a slot repeated within its group, which the CUDA kernels' scatter would keep once).
#pragma once

#include <ATen/Parallel.h>
#include <c10/util/Exception.h>

#include <bitset>
#include <cstdint>

#include "common/slot_checks.h"
#include "common/slot_layout.h"

namespace sparsetorch::cpu {

// visit(row, col, entry) for every entry, after the offsets' checks and its own; groups are walked in parallel
// (at::parallel_for, 64 groups per task), so visit runs on several threads at once.
template <typename Visit>
void for_each_slot_entry(const SlotProblem& p, const int32_t* op, const uint32_t* ep, int64_t nnz, Visit visit) {
  TORCH_CHECK_INDEX(op[0] == 0 && op[p.groups] == nnz, "offsets: expected to run from 0 to ", nnz,
                    " (the number of entries), got ", op[0], " .. ", op[p.groups]);
  for (int64_t g = 0; g < p.groups; ++g) {
    TORCH_CHECK_INDEX(op[g] <= op[g + 1], "offsets: expected non-decreasing offsets, got offsets[", g, "] = ", op[g],
                      " > offsets[", g + 1, "] = ", op[g + 1]);
  }
  at::parallel_for(0, p.groups, 64, [&](int64_t begin, int64_t end) {
    for (int64_t g = begin; g < end; ++g) {
      int64_t strip = 0, chunk = 0;
      slot_group_position(g, p.chunks, p.banded, strip, chunk);
      const int64_t row0 = strip * kBitmapGroupRows, col0 = chunk * kBitmapGroupCols;
      std::bitset<kBitmapGroupElems> seen;
      for (int64_t j = op[g]; j < op[g + 1]; ++j) {
        TORCH_CHECK_INDEX((ep[j] & 0xffffu) <= static_cast<uint32_t>(kSlotMask), "entries: entry ", j, " has slot ",
                          ep[j] & 0xffffu, ", expected 0 .. ", kSlotMask);
        const int slot = static_cast<int>(ep[j] & kSlotMask);
        int rr = 0, cc = 0;
        slot_position(fragment_slot(slot, p.banded), rr, cc);
        TORCH_CHECK_INDEX(row0 + rr < p.m && col0 + cc < p.k, "entries: entry ", j, " (slot ", slot, " of group ", g,
                          ") is at row ", row0 + rr, ", column ", col0 + cc, ", outside the ", p.m, " x ", p.k,
                          " weight");
        TORCH_CHECK_INDEX(!seen[slot], "entries: entry ", j, " repeats slot ", slot, " of group ", g,
                          " (expected distinct slots within a group)");
        seen[slot] = true;
        visit(row0 + rr, col0 + cc, ep[j]);
      }
    }
  });
}

}  // namespace sparsetorch::cpu
