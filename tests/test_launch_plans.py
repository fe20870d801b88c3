"""The CUDA kernels' launch plans against the limits of the GPUs users have, with faked device properties.

The plans are pure functions of (shape, dtype, device limits) in plain C++ headers (csrc/cuda/*_plan.h,
spmm_plans.h) compiled into every build, reached through the test library
(torch.ops.sparsetorch_testing.launch_plan), so these run on a machine without a GPU. What they check is what
a launch on such a GPU needs: the shared memory a block asks for within the GPU's opt-in limit, a block's
share of an SM within the SM's, grid dimensions within CUDA's, and the work covered.
"""
from collections import namedtuple

import pytest
import torch

import sparsetorch  # noqa: F401  (loads the library and its test hooks)

testing = torch.ops.sparsetorch_testing

GPU = namedtuple("GPU", "name cc sms smem_per_sm reserved optin threads_per_sm")
# cudaDeviceProp values (CUDA programming guide, compute capability tables; the SM counts of each product).
GPUS = [
    GPU("H100 SXM", (9, 0), 132, 233472, 1024, 232448, 2048),
    GPU("A100", (8, 0), 108, 167936, 1024, 166912, 2048),
    GPU("A10", (8, 6), 72, 102400, 1024, 101376, 1536),
    GPU("RTX 3090", (8, 6), 82, 102400, 1024, 101376, 1536),
    GPU("L4", (8, 9), 58, 102400, 1024, 101376, 1536),
    GPU("RTX 4090", (8, 9), 128, 102400, 1024, 101376, 1536),
    GPU("T4", (7, 5), 40, 65536, 0, 65536, 1024),
]
# The tensor-core forms (bitmap, slots, 2:4 decode) need sm_80.
SM80_GPUS = [g for g in GPUS if g.cc >= (8, 0)]
# A made-up GPU with the 48 KB a block gets without opting in: a plan that ignores the limits overflows it.
TINY = GPU("48 KB per block", (8, 0), 16, 50176, 1024, 49152, 1024)
ids = lambda gpus: [g.name for g in gpus]  # noqa: E731

# Pruned-weight shapes (out, in) of the pruned suite and the Llama-3-8B MLP.
SHAPES = [(11008, 4096), (4096, 11008), (4096, 4096), (1024, 4096), (14336, 4096), (4096, 14336), (48, 96)]
TOKENS = [1, 8, 16, 33, 64, 200]
GRID_Y_Z_MAX = 65535


def limits(gpu):
    return [gpu.sms, gpu.smem_per_sm, gpu.reserved, gpu.optin, gpu.threads_per_sm]


def check_fits(gpu, plan):
    """A block's shared memory fits the GPU's opt-in limit, and at least one block fits an SM."""
    assert 0 < plan["smem"] <= gpu.optin, plan
    assert plan["smem"] + gpu.reserved <= gpu.smem_per_sm, plan
    assert plan["threads"] <= 1024


@pytest.mark.parametrize("gpu", SM80_GPUS + [TINY], ids=ids(SM80_GPUS + [TINY]))
@pytest.mark.parametrize("sparsity", [0.5, 0.7, 0.9, 0.98])
def test_bitmap_plan(gpu, sparsity):
    for m, k in SHAPES:
        nvalues = int(m * k * (1 - sparsity))
        for n in TOKENS:
            plan = testing.launch_plan("bitmap", [m, n, k, nvalues], limits(gpu))
            if gpu is TINY and plan["smem"] == 0:
                continue  # no configuration fits 48 KB: the launcher raises a clear error (every sm_80 GPU has 99 KB+)
            check_fits(gpu, plan)
            strips, chunks = -(-m // 16), -(-k // 64)
            assert plan["ws"] * plan["wk"] == 8
            assert plan["row_blocks"] * plan["ws"] >= strips
            assert plan["splits"] * plan["chunks_per_split"] >= chunks
            assert plan["column_tiles"] * 8 * plan["nt"] >= n
            assert plan["row_blocks"] <= GRID_Y_Z_MAX and plan["splits"] <= GRID_Y_Z_MAX
            # The kernel is compiled for min_blocks blocks per SM (registers); shared memory may allow fewer,
            # never more than the SM holds when the plan counts on them.
            per_sm = min(plan["min_blocks"], gpu.smem_per_sm // (plan["smem"] + gpu.reserved))
            assert per_sm >= 1


def test_bitmap_plan_adapts_to_the_smaller_gpus():
    """Dense weights' stages (two groups each) overflow 99 KB per block: on an L4 or RTX card the plan takes
    one group per stage, where the H100 keeps two."""
    m, k, n = 11008, 4096, 1
    nvalues = m * k // 2
    h100 = testing.launch_plan("bitmap", [m, n, k, nvalues], limits(GPUS[0]))
    l4 = testing.launch_plan("bitmap", [m, n, k, nvalues], limits(GPUS[4]))
    assert h100["dense"] and h100["batch"] == 2 and h100["smem"] > GPUS[4].optin
    assert l4["dense"] and l4["batch"] == 1 and l4["smem"] <= GPUS[4].optin


@pytest.mark.parametrize("gpu", SM80_GPUS + [TINY], ids=ids(SM80_GPUS + [TINY]))
@pytest.mark.parametrize("banded", [False, True])
def test_slot_plan(gpu, banded):
    for m, k in SHAPES:
        for n in TOKENS:
            plan = testing.launch_plan("slot", [m, n, k, int(banded)], limits(gpu))
            check_fits(gpu, plan)
            assert plan["nt"] <= (4 if banded else 8)
            assert plan["ws"] * plan["wk"] == 8
            assert plan["row_blocks"] * plan["ws"] >= plan["units"]
            assert plan["splits"] * plan["chunks_per_split"] >= -(-k // 64)
            assert plan["column_tiles"] * 8 * plan["nt"] >= n
            assert plan["row_blocks"] <= GRID_Y_Z_MAX and plan["splits"] <= GRID_Y_Z_MAX
            if plan["held"]:  # run at kHeldBlocks per SM: they must fit the SM's shared memory
                assert plan["min_blocks"] * (plan["smem"] + gpu.reserved) <= gpu.smem_per_sm


@pytest.mark.parametrize("gpu", SM80_GPUS + [TINY], ids=ids(SM80_GPUS + [TINY]))
@pytest.mark.parametrize("cluster", [False, True])
def test_sparse24_decode_plan(gpu, cluster):
    if cluster and gpu.cc < (9, 0):
        pytest.skip("the cluster path is compiled for sm_90 only; a loaded kernel below it never plans it")
    for m, k in SHAPES:
        if m % 16 or k % 32:
            continue
        for n in [1, 8, 16, 33, 64]:
            plan = testing.launch_plan("sparse24_decode", [m, n, k], limits(gpu), cluster=cluster)
            check_fits(gpu, plan)
            assert plan["splits"] * plan["steps_per_split"] * plan["u"] >= plan["ktp"]
            assert plan["row_groups"] * plan["warps"] * plan["rt"] * 16 >= m
            assert plan["nt"] * 8 >= n
            assert plan["splits"] <= GRID_Y_Z_MAX
            if plan["cluster"]:
                assert 2 <= plan["splits"] <= 8 and plan["workspace_bytes"] == 0
            else:
                assert (plan["workspace_bytes"] > 0) == (plan["splits"] > 1)


def test_sparse24_decode_plan_without_clusters_when_the_kernel_lacks_them():
    """What the launcher passes as `cluster` is the loaded kernel's capability: False plans no cluster, even
    with the H100's limits (a compute_80 build on an H100)."""
    plan = testing.launch_plan("sparse24_decode", [14336, 1, 4096], limits(GPUS[0]), cluster=False)
    assert not plan["cluster"]
    assert testing.launch_plan("sparse24_decode", [14336, 1, 4096], limits(GPUS[0]), cluster=True)["cluster"]


@pytest.mark.parametrize("gpu", GPUS + [TINY], ids=ids(GPUS + [TINY]))
def test_tiled_route(gpu):
    """Tiled stages 64 KB (fp32 / fp64) or 32 KB (half types) per block: every GPU from the T4 on holds it; a
    GPU that could not is told so by the availability query, which the routing asks."""
    for dtype, elem in [(torch.float16, 2), (torch.bfloat16, 2), (torch.float32, 4), (torch.float64, 8)]:
        plan = testing.launch_plan("tiled", [elem], limits(gpu))
        reason = testing.spmm_route_limits("tiled", dtype, gpu.optin, *gpu.cc)
        if plan["smem"] <= gpu.optin:
            check_fits(gpu, plan)
            assert reason == ""
        else:
            assert gpu is TINY and "shared memory" in reason
    assert testing.launch_plan("tiled", [4], limits(GPUS[-1]))["smem"] == 65536  # the T4's whole opt-in


@pytest.mark.parametrize("gpu", GPUS, ids=ids(GPUS))
def test_blocked_route(gpu):
    """The blocked kernel's ~204 KB per block fit only the H100 / H200: elsewhere the route is unavailable
    (SpmmPlan leaves it out), with the reason."""
    plan = testing.launch_plan("blocked", [4096, 256, 4096], limits(gpu))
    reason = testing.spmm_route_limits("blocked", torch.float32, gpu.optin, *gpu.cc)
    if gpu.cc >= (9, 0):
        check_fits(gpu, plan)
        assert reason == ""
    else:
        assert plan["smem"] > gpu.optin
        assert "blocked needs" in reason and str(gpu.optin) in reason
    assert 1 <= plan["splits"] <= 8


@pytest.mark.parametrize("gpu", GPUS, ids=ids(GPUS))
def test_cusparse_and_densify_bf16_need_sm80(gpu):
    for route in ["cusparse", "densify"]:
        for dtype in [torch.float16, torch.float32, torch.float64]:
            assert testing.spmm_route_limits(route, dtype, gpu.optin, *gpu.cc) == ""
        reason = testing.spmm_route_limits(route, torch.bfloat16, gpu.optin, *gpu.cc)
        assert (reason == "") == (gpu.cc >= (8, 0)), reason
    for route in ["native", "balanced", "split"]:  # CUDA cores: every GPU, every dtype
        for dtype in [torch.float16, torch.bfloat16, torch.float32, torch.float64]:
            assert testing.spmm_route_limits(route, dtype, gpu.optin, *gpu.cc) == ""


def test_split_units_follow_the_threads_an_sm_holds():
    """The split route sizes its units for about 4 per group of lanes the GPU holds at once: a T4 (40 SMs of
    1024 threads) holds a fifth of the groups of an H100 (132 of 2048), so its units are larger."""
    entries, rows, n, lanes = 20_000_000, 1_000_000, 32, 8
    units = {g.name: testing.launch_plan("split", [entries, rows, n, lanes], limits(g))["unit_entries"] for g in GPUS}
    assert all(64 <= u <= 4096 for u in units.values())
    h100_groups = 132 * 2048 // lanes
    t4_groups = 40 * 1024 // lanes
    assert units["H100 SXM"] == -(-entries // (4 * h100_groups))
    assert units["T4"] == -(-entries // (4 * t4_groups))


def test_bad_plan_requests_raise():
    with pytest.raises(ValueError, match="unknown kernel"):
        testing.launch_plan("nope", [1], limits(GPUS[0]))
    with pytest.raises(ValueError, match="takes 4 shape values"):
        testing.launch_plan("bitmap", [1, 2], limits(GPUS[0]))
    with pytest.raises(ValueError, match="limits"):
        testing.launch_plan("tiled", [4], [1, 2])
    with pytest.raises(ValueError, match="m % 16"):
        testing.launch_plan("sparse24_decode", [10, 1, 64], limits(GPUS[0]))
