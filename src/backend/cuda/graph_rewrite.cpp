#include "backend/cuda/graph_rewrite.h"

#include <vector>

namespace inferx::cuda {
namespace {

struct Edges {
  std::vector<cudaGraphNode_t> nodes;
  std::vector<cudaGraphEdgeData> data;
};

// A node's dependencies (in) or dependents (out) with their edge data; false when the call fails.
bool edges_of(cudaGraphNode_t node, bool in, Edges& e) {
  size_t n = 0;
  const auto get = [&](cudaGraphNode_t* nodes, cudaGraphEdgeData* data, size_t* count) {
    return in ? cudaGraphNodeGetDependencies(node, nodes, data, count)
              : cudaGraphNodeGetDependentNodes(node, nodes, data, count);
  };
  if (get(nullptr, nullptr, &n) != cudaSuccess) return false;
  e.nodes.assign(n, nullptr);
  e.data.assign(n, cudaGraphEdgeData{});
  return n == 0 || get(e.nodes.data(), e.data.data(), &n) == cudaSuccess;
}

bool is_type(cudaGraphNode_t node, cudaGraphNodeType want) {
  cudaGraphNodeType t{};
  return cudaGraphNodeGetType(node, &t) == cudaSuccess && t == want;
}

bool memset_destination(cudaGraphNode_t node, const void*& dst) {
  cudaMemsetParams p{};
  if (cudaGraphMemsetNodeGetParams(node, &p) != cudaSuccess) return false;
  dst = p.dst;
  return true;
}

// A plain edge: full completion of the upstream node, the whole downstream node waits.
bool full_edge(const cudaGraphEdgeData& d) {
  return d.from_port == 0 && d.to_port == 0 && d.type == cudaGraphDependencyTypeDefault;
}

// A memset node M of `dedicated` memory in a chain P -> M -> K: one dependency P and one dependent K, both
// kernel nodes, on full-completion edges (how stream capture records cuBLASLt's workspace memset).
struct ChainMemset {
  cudaGraphNode_t m, p, k;
  cudaMemsetParams params;
  cudaGraphEdgeData p_edge;  // P -> M
};

// Every such memset of the graph (collected first: the rewrites change edges and nodes as they go); false
// when a graph call fails.
bool chain_memsets(cudaGraph_t graph, const std::function<bool(const void*)>& dedicated,
                   std::vector<ChainMemset>& found) {
  size_t count = 0;
  if (cudaGraphGetNodes(graph, nullptr, &count) != cudaSuccess) return false;
  std::vector<cudaGraphNode_t> nodes(count);
  if (count > 0 && cudaGraphGetNodes(graph, nodes.data(), &count) != cudaSuccess) return false;
  for (cudaGraphNode_t m : nodes) {
    if (!is_type(m, cudaGraphNodeTypeMemset)) continue;
    cudaMemsetParams params{};
    if (cudaGraphMemsetNodeGetParams(m, &params) != cudaSuccess) return false;
    if (!dedicated(params.dst)) continue;
    Edges in, out;
    if (!edges_of(m, true, in) || !edges_of(m, false, out)) return false;
    if (in.nodes.size() != 1 || out.nodes.size() != 1 || !full_edge(in.data[0]) || !full_edge(out.data[0]))
      continue;
    if (!is_type(in.nodes[0], cudaGraphNodeTypeKernel) || !is_type(out.nodes[0], cudaGraphNodeTypeKernel))
      continue;
    found.push_back({m, in.nodes[0], out.nodes[0], params, in.data[0]});
  }
  return true;
}

}  // namespace

int hoist_workspace_memsets(cudaGraph_t graph, const std::function<bool(const void*)>& dedicated) {
  std::vector<ChainMemset> found;
  if (!chain_memsets(graph, dedicated, found)) return -1;
  int moved = 0;
  const cudaGraphEdgeData plain{};
  for (const auto& [m, p, k, params, p_edge] : found) {
    // An earlier move may have given M a second dependent (M preceded the producer of a memset moved before).
    Edges m_out, p_in;
    if (!edges_of(m, false, m_out) || !edges_of(p, true, p_in)) return -1;
    if (m_out.nodes.size() != 1) continue;
    bool same_product_before = false;
    for (cudaGraphNode_t q : p_in.nodes) {
      const void* qdst = nullptr;
      if (is_type(q, cudaGraphNodeTypeMemset) && memset_destination(q, qdst) && qdst == params.dst)
        same_product_before = true;
    }
    if (same_product_before) continue;
    // P -> K first, so K never loses its wait on P; then M leaves P for P's own dependencies.
    if (cudaGraphAddDependencies(graph, &p, &k, &plain, 1) != cudaSuccess) return -1;
    if (cudaGraphRemoveDependencies(graph, &p, &m, &p_edge, 1) != cudaSuccess) return -1;
    for (cudaGraphNode_t q : p_in.nodes)
      if (cudaGraphAddDependencies(graph, &q, &m, &plain, 1) != cudaSuccess) return -1;
    ++moved;
  }
  return moved;
}

cudaError_t instantiate_rewritten(cudaGraph_t recorded, const std::function<int(cudaGraph_t)>& rewrite,
                                  cudaGraphExec_t* exec, int* rewritten) {
  *exec = nullptr;
  *rewritten = -1;
  cudaGraph_t copy = nullptr;
  if (cudaGraphClone(&copy, recorded) == cudaSuccess) {
    const int count = rewrite(copy);
    if (count >= 0 && cudaGraphInstantiate(exec, copy, 0) == cudaSuccess) {
      *rewritten = count;
    } else {
      *exec = nullptr;
    }
    (void)cudaGraphDestroy(copy);
  }
  if (*rewritten >= 0) return cudaSuccess;
  (void)cudaGetLastError();  // the failed call's error is not the recorded graph's
  return cudaGraphInstantiate(exec, recorded, 0);
}

int replace_workspace_memsets(cudaGraph_t graph, const std::function<bool(const void*)>& dedicated,
                              const void* zero_kernel, bool programmatic) {
  std::vector<ChainMemset> found;
  if (!chain_memsets(graph, dedicated, found)) return -1;
  int replaced = 0;
  const cudaGraphEdgeData plain{};
  cudaGraphEdgeData early{};
  early.type = cudaGraphDependencyTypeProgrammatic;
  early.from_port = cudaGraphKernelNodePortProgrammatic;
  for (auto [m, p, k, mp, p_edge] : found) {
    const size_t bytes = static_cast<size_t>(mp.elementSize) * mp.width;
    if (mp.value != 0 || mp.height > 1 || bytes == 0 || bytes > 256) continue;
    auto* dst = static_cast<unsigned char*>(mp.dst);
    auto n = static_cast<unsigned>(bytes);
    void* args[] = {&dst, &n};
    cudaKernelNodeParams kp{};
    kp.func = const_cast<void*>(zero_kernel);
    kp.gridDim = dim3(1);
    kp.blockDim = dim3(32);
    kp.kernelParams = args;
    cudaGraphNode_t z = nullptr;
    if (cudaGraphAddKernelNode(&z, graph, nullptr, 0, &kp) != cudaSuccess) return -1;
    // Z -> K before M goes, so K never loses its wait.
    if (cudaGraphAddDependencies(graph, &z, &k, &plain, 1) != cudaSuccess) return -1;
    if (!programmatic || cudaGraphAddDependencies(graph, &p, &z, &early, 1) != cudaSuccess) {
      (void)cudaGetLastError();  // a driver without programmatic edges in graphs: a plain one
      if (cudaGraphAddDependencies(graph, &p, &z, &plain, 1) != cudaSuccess) return -1;
    }
    if (cudaGraphDestroyNode(m) != cudaSuccess) return -1;
    ++replaced;
  }
  return replaced;
}

}  // namespace inferx::cuda
