"""The elementwise kernels and the fused bias + activation against the copy bandwidth."""
from __future__ import annotations

import math
from typing import List

import torch

import sparsetorch as st
from sparsetorch.bench.suites.common import Context, Job
from sparsetorch.bench.timing import check


def elementwise_suite(ctx: Context) -> List[Job]:
    numel = 2**26 if ctx.cuda else 2**22
    dtypes = [torch.float32, torch.bfloat16] if ctx.cuda else [torch.float32]
    compile_too = ctx.cuda and not ctx.quick

    def job(dtype):
        def run():
            import torch.nn.functional as F

            label = str(dtype).replace("torch.", "")
            size = torch.tensor([], dtype=dtype).element_size()
            x = torch.randn(numel, device=ctx.device, dtype=dtype)
            y = torch.randn(numel, device=ctx.device, dtype=dtype)
            dst = torch.empty_like(x)
            copy_s = ctx.timer(lambda: dst.copy_(x))
            width = 1024
            x2 = x.view(-1, width)
            bias = torch.randn(width, device=ctx.device, dtype=dtype)
            scale = torch.randn(width, device=ctx.device, dtype=dtype)
            x64, s64, b64 = x2.double(), scale.double(), bias.double()
            fused_ref = F.gelu(x64 * s64 + b64)

            def eager():
                return F.gelu(x2 * scale + bias)

            cases = [("copy (ceiling)", lambda: dst.copy_(x), x.double(), 2),
                     ("st.add", lambda: st.add(x, y, alpha=2.0), x.double() + 2 * y.double(), 3),
                     ("st.relu", lambda: st.relu(x), F.relu(x.double()), 2),
                     ("st.gelu", lambda: st.gelu(x), F.gelu(x.double()), 2),
                     ("st.bias_act gelu (fused)", lambda: st.bias_act(x2, bias=bias, scale=scale, activation="gelu"),
                      fused_ref, 2),
                     ("eager gelu(x*scale+bias)", eager, fused_ref, 2)]
            if compile_too:
                cases.append(("torch.compile gelu(x*scale+bias)", torch.compile(eager), fused_ref, 2))
            rows = []
            tol = 1e-5 if dtype == torch.float32 else 1e-2
            for name, fn, ref, tensors in cases:
                err = check(fn(), ref.view(-1) if ref.dim() == 1 else ref, f"elementwise {name}", tol)
                seconds = copy_s if name.startswith("copy") else ctx.timer(fn)
                nbytes = tensors * numel * size
                # The fused kernel, eager torch and torch.compile share one case (compared); the
                # single kernels are each their own case, held to the copy bandwidth.
                what = "gelu(x*scale+bias)" if "gelu(x*scale+bias)" in name or "fused" in name else name
                rows.append({"suite": "elementwise", "case": f"{what}, 2^{int(math.log2(numel))} elements",
                             "impl": name, "dtype": label, "time_ms": seconds * 1e3, "GBps": nbytes / seconds / 1e9,
                             "GFLOPs": 0.0, "floor_ms": nbytes / ctx.ceilings.bandwidth * 1e3,
                             "of_floor": nbytes / ctx.ceilings.bandwidth / seconds,
                             "of_copy": (nbytes / seconds) / (2 * numel * size / copy_s), "rel_err": err})
            return rows

        return run

    return [job(dt) for dt in dtypes]


