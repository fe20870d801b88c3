"""The elementwise kernels and the fused bias + activation against the copy bandwidth."""
from __future__ import annotations

import math
from typing import List

import torch

import sparsetorch as st
from benchmarks.suites.common import Context, Job
from benchmarks.harness import check, copy_elements


def elementwise_suite(ctx: Context) -> List[Job]:
    numel = copy_elements(ctx.device)  # the size of the copy that measured the ceiling
    dtypes = [torch.float32, torch.bfloat16] if ctx.cuda else [torch.float32]
    compile_too = ctx.cuda and not ctx.quick

    def job(dtype):
        def run():
            import torch.nn.functional as F

            label = str(dtype).replace("torch.", "")
            size = torch.tensor([], dtype=dtype).element_size()
            x = torch.randn(numel, device=ctx.device, dtype=dtype)
            y = torch.randn(numel, device=ctx.device, dtype=dtype)
            width = 1024
            x2 = x.view(-1, width)
            bias = torch.randn(width, device=ctx.device, dtype=dtype)
            scale = torch.randn(width, device=ctx.device, dtype=dtype)
            x64, s64, b64 = x2.double(), scale.double(), bias.double()
            fused_ref = F.gelu(x64 * s64 + b64)

            def eager():
                return F.gelu(x2 * scale + bias)

            cases = [("st.add", lambda: st.add(x, y, alpha=2.0), x.double() + 2 * y.double(), 3),
                     ("st.relu", lambda: st.relu(x), F.relu(x.double()), 2),
                     ("st.gelu", lambda: st.gelu(x), F.gelu(x.double()), 2),
                     ("st.bias_act gelu (fused)", lambda: st.bias_act(x2, bias=bias, scale=scale, activation="gelu"),
                      fused_ref, 2),
                     ("eager gelu(x*scale+bias)", eager, fused_ref, 2)]
            if compile_too:
                cases.append(("torch.compile gelu(x*scale+bias)", torch.compile(eager), fused_ref, 2))
            # The copy row is the ceiling itself (measured once at the start of the run, float32, this size):
            # every row's floor divides by the same bandwidth, so the copy reads 100% of floor.
            copy_bytes = 2 * numel * size
            copy_s = copy_bytes / ctx.ceilings.bandwidth
            rows = [_row(numel, "copy (ceiling)", label, copy_s, copy_bytes, ctx.ceilings.bandwidth, 0.0)]
            tol = 1e-5 if dtype == torch.float32 else 1e-2
            for name, fn, ref, tensors in cases:
                err = check(fn(), ref.view(-1) if ref.dim() == 1 else ref, f"elementwise {name}", tol)
                rows.append(_row(numel, name, label, ctx.timer(fn), tensors * numel * size, ctx.ceilings.bandwidth,
                                 err))
            return rows

        return run

    return [job(dt) for dt in dtypes]


def _row(numel: int, name: str, label: str, seconds: float, nbytes: int, bandwidth: float, err: float) -> dict:
    # The fused kernel, eager torch and torch.compile share one case (compared); the single kernels are each
    # their own case, held to the copy bandwidth.
    what = "gelu(x*scale+bias)" if "gelu(x*scale+bias)" in name or "fused" in name else name
    floor = nbytes / bandwidth
    return {"suite": "elementwise", "case": f"{what}, 2^{int(math.log2(numel))} elements", "impl": name,
            "dtype": label, "time_ms": seconds * 1e3, "GBps": nbytes / seconds / 1e9, "GFLOPs": 0.0,
            "floor_ms": floor * 1e3, "of_floor": floor / seconds, "rel_err": err}
