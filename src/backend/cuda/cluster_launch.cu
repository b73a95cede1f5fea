// cluster_launch_fits (cuda_common.cuh): whether a thread-block-cluster launch runs in one wave, asked of the
// occupancy calculator once per device, kernel and shape.

#include <map>
#include <mutex>
#include <tuple>

#include "backend/cuda/cuda_common.cuh"

namespace inferx::cuda {

bool cluster_launch_fits(const void* kernel, dim3 cluster, int threads, int smem, unsigned clusters) {
  int device = 0;
  if (cudaGetDevice(&device) != cudaSuccess) {
    (void)cudaGetLastError();
    return false;
  }
  using Key = std::tuple<int, const void*, unsigned, unsigned, unsigned, int, int>;
  static std::mutex mu;
  static std::map<Key, int> max_active;  // clusters resident at once; 0: none, or the driver refused
  const Key key{device, kernel, cluster.x, cluster.y, cluster.z, threads, smem};
  const std::lock_guard<std::mutex> lock(mu);
  auto it = max_active.find(key);
  if (it == max_active.end()) {
    int n = 0;
    // Above 8 CTAs a cluster needs the kernel's non-portable attribute (per device: set under this key).
    if (cluster.x * cluster.y * cluster.z > 8 &&
        cudaFuncSetAttribute(kernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess)
      (void)cudaGetLastError();
    cudaLaunchAttribute attribute = {};
    attribute.id = cudaLaunchAttributeClusterDimension;
    attribute.val.clusterDim.x = cluster.x;
    attribute.val.clusterDim.y = cluster.y;
    attribute.val.clusterDim.z = cluster.z;
    cudaLaunchConfig_t config = {};
    config.gridDim = cluster;
    config.blockDim = dim3(static_cast<unsigned>(threads));
    config.dynamicSmemBytes = static_cast<size_t>(smem);
    config.attrs = &attribute;
    config.numAttrs = 1;
    if (cudaOccupancyMaxActiveClusters(&n, kernel, &config) != cudaSuccess) {
      (void)cudaGetLastError();  // not fatal: the caller takes its unclustered form
      n = 0;
    }
    it = max_active.emplace(key, n).first;
  }
  return it->second > 0 && clusters <= static_cast<unsigned>(it->second);
}

}  // namespace inferx::cuda
