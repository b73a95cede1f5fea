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

// Replaces each such memset with a kernel node in the chain. Hoisted (above), the memset ran beside P, but K
// still started 4.9 us after P ended (H100 timeline, 2026-12-06 15:29: a node with two dependencies, one of
// them a memset, waits ~as long as the chain P -> M -> K did: ~1.7 of the 6.6 us saved), while the
// GEMMs whose only dependency is a kernel start as it ends. So for every memset node M of `dedicated` memory
// that zeroes at most 256 bytes, with one dependency P and one dependent K (kernel nodes, full-completion
// edges), the chain P -> M -> K becomes P -> Z -> K, where Z = `zero_kernel` (a kernel of the signature
// (unsigned char* dst, unsigned bytes) that waits for its predecessor with griddepcontrol.wait and then
// zeroes dst: cuda::workspace_zero_kernel(), kernels.h) on a programmatic edge from P when
// `programmatic` (Z launches while P runs and completes right after it; K's full-completion edge from Z
// then covers P too), else a plain one. Returns how many memsets were replaced, or -1 when a graph call
// failed (the graph must not be used then).
int replace_workspace_memsets(cudaGraph_t graph, const std::function<bool(const void*)>& dedicated,
                              const void* zero_kernel, bool programmatic);

// Instantiates `recorded` after `rewrite` (one of the above, applied to a clone of it), or `recorded` as it
// is when the rewrite fails (returns < 0) or its graph does not instantiate: a recorded step must not fall
// back to eager launches over a rewrite that only saves microseconds. *rewritten is the rewrite's count when
// its graph was taken, -1 when the recorded one was. Returns the instantiation status of the graph taken;
// `recorded` is left to the caller.
cudaError_t instantiate_rewritten(cudaGraph_t recorded, const std::function<int(cudaGraph_t)>& rewrite,
                                  cudaGraphExec_t* exec, int* rewritten);

}  // namespace inferx::cuda
