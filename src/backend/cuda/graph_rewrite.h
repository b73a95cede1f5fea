#pragma once
// Rewrites of a captured CUDA graph before it is instantiated.
#include <cuda_runtime_api.h>

#include <functional>

namespace inferx::cuda {

// Runs each cuBLASLt workspace memset earlier. cuBLASLt zeroes the tile counter of a persistent GEMM kernel
// with a memset node between the kernel and its producer P, and in a decode step's graph that costs: the
// FP8 gate/up GEMM of a 512-row Llama-3-8B step started 1.5 + 0.9 + 4.2 us after its producer (memset
// launch, memset, kernel launch) where the GEMMs without one start as their producer ends (CUPTI timeline,
// H100 2026-12-06). For every memset node M whose destination `dedicated` accepts (a workspace that only
// the following kernel K uses: LtMatmul::set_dedicated_workspaces), with exactly one dependency P (a kernel
// node, full-completion edge) and exactly one dependent K (a kernel node), the edges P -> M -> K become
// (P's dependencies) -> M -> K and P -> K: M runs beside P, and K still waits for both. Skipped when P is
// itself preceded by a memset of the same destination (the same product twice in a row). Returns how many
// memsets moved, or -1 when a graph call failed (the graph is then unchanged or must not be used: the
// caller checks the CUDA error).
int hoist_workspace_memsets(cudaGraph_t graph, const std::function<bool(const void*)>& dedicated);

}  // namespace inferx::cuda
