#include "model/fused_projections.h"

#include <algorithm>
#include <cstring>

#include "backend/fused_linear.h"
#include "core/error.h"

namespace inferx {

namespace {

bool stackable(const Backend& backend, const std::vector<Linear*>& parts) {
  const Linear& a = *parts[0];
  for (const Linear* p : parts) {
    const Tensor& w = p->weight;
    if (w.empty() || w.ndim != 2 || w.device != backend.device() || w.dtype != a.weight.dtype ||
        p->in_features() != a.in_features() || !p->input_perm.empty() || p->group_size != a.group_size ||
        p->zero.empty() != a.zero.empty() || p->scale.empty() != a.scale.empty())
      return false;
    if (!p->bias.empty() && (p->bias.dtype != DType::F32 || p->bias.numel() != p->out_features()))
      return false;
    switch (w.dtype) {
      case DType::F8_E4M3:
        if (p->scale.dtype != DType::F32 || (p->scale.numel() != 1 && p->scale.numel() != p->out_features()))
          return false;
        break;
      case DType::INT4:
        if (p->scale.dtype != DType::F16 || p->scale.rows() != p->out_features() ||
            p->scale.cols() != a.scale.cols() ||
            (!p->zero.empty() && (p->zero.dtype != DType::U8 || p->zero.rows() != p->out_features())))
          return false;
        break;
      default:
        if (!p->scale.empty() || !p->zero.empty()) return false;
    }
  }
  return true;
}

class Fuser {
 public:
  Fuser(Backend& backend, std::vector<std::unique_ptr<DeviceBuffer>>& owned) : be_(backend), owned_(owned) {}

  // Stacks the parts' rows into one Linear; the parts become its row views.
  Linear fuse(const std::vector<Linear*>& parts) {
    const Linear& a = *parts[0];
    const DType dt = a.weight.dtype;
    const int64_t k = a.in_features();
    int64_t n = 0;
    bool any_bias = false;
    for (const Linear* p : parts) {
      n += p->out_features();
      any_bias = any_bias || !p->bias.empty();
    }
    Linear f;
    f.group_size = a.group_size;
    f.weight = stack(dt, {n, k}, parts, [](const Linear& p) -> const Tensor& { return p.weight; });
    if (any_bias) {
      f.bias = Tensor(DType::F32, {n}, alloc(static_cast<size_t>(n) * 4), be_.device());  // zeros
      int64_t at = 0;
      for (const Linear* p : parts) {
        if (!p->bias.empty())
          be_.copy_on_device(static_cast<float*>(f.bias.data) + at, p->bias.data,
                             static_cast<size_t>(p->bias.nbytes()));
        at += p->out_features();
      }
    }
    if (dt == DType::F8_E4M3) {
      // One per-tensor scale when the parts share it, else per channel (a per-tensor part repeated).
      std::vector<float> scales;
      for (const Linear* p : parts) {
        std::vector<float> s(static_cast<size_t>(p->scale.numel()));
        be_.copy_to_host(s.data(), p->scale.data, s.size() * 4);
        if (s.size() == 1) s.assign(static_cast<size_t>(p->out_features()), s[0]);
        scales.insert(scales.end(), s.begin(), s.end());
      }
      const bool shared = std::all_of(parts.begin(), parts.end(), [&](const Linear* p) {
        return p->scale.numel() == 1 &&
               std::all_of(scales.begin(), scales.end(), [&](float v) { return v == scales[0]; });
      });
      if (shared) scales.resize(1);
      f.scale =
          Tensor(DType::F32, {static_cast<int64_t>(scales.size())}, alloc(scales.size() * 4), be_.device());
      be_.copy_to_device(f.scale.data, scales.data(), scales.size() * 4);
    } else if (dt == DType::INT4) {
      f.scale = stack(DType::F16, {n, a.scale.cols()}, parts,
                      [](const Linear& p) -> const Tensor& { return p.scale; });
      if (!a.zero.empty())
        f.zero = stack(DType::U8, {n, a.zero.cols()}, parts,
                       [](const Linear& p) -> const Tensor& { return p.zero; });
    }
    be_.synchronize();  // the copies are done before the parts' buffers go
    int64_t at = 0;
    for (Linear* p : parts) {
      for (const Tensor* t : {&p->weight, &p->bias, &p->scale, &p->zero}) release(*t);
      const int64_t rows = p->out_features();
      *p = linear_rows(f, at, rows);
      at += rows;
    }
    return f;
  }

 private:
  void* alloc(size_t bytes) {
    owned_.push_back(be_.allocate(bytes));
    return owned_.back()->data();
  }

  template <class Get>
  Tensor stack(DType dt, std::initializer_list<int64_t> shape, const std::vector<Linear*>& parts, Get get) {
    Tensor t(dt, shape, nullptr, be_.device());
    t.data = alloc(static_cast<size_t>(t.nbytes()));
    size_t at = 0;
    for (const Linear* p : parts) {
      const Tensor& s = get(*p);
      be_.copy_on_device(static_cast<char*>(t.data) + at, s.data, static_cast<size_t>(s.nbytes()));
      at += static_cast<size_t>(s.nbytes());
    }
    INFERX_CHECK(at == static_cast<size_t>(t.nbytes()), "internal: fused {} of {} bytes from parts of {}",
                 t.shape_string(), t.nbytes(), at);
    return t;
  }

  // Frees the loader buffer that starts at t.data (views into memory the loader does not own, e.g. a
  // memory-mapped file, are left alone).
  void release(const Tensor& t) {
    if (t.empty()) return;
    auto it = std::find_if(owned_.begin(), owned_.end(),
                           [&](const std::unique_ptr<DeviceBuffer>& b) { return b && b->data() == t.data; });
    if (it != owned_.end()) owned_.erase(it);
  }

  Backend& be_;
  std::vector<std::unique_ptr<DeviceBuffer>>& owned_;
};

}  // namespace

int fuse_projections(Backend& backend, std::vector<std::unique_ptr<DeviceBuffer>>& owned,
                     std::vector<LayerWeights>& layers) {
  Fuser fuser(backend, owned);
  int fused = 0;
  for (LayerWeights& l : layers) {
    const std::vector<Linear*> qkv = {&l.q, &l.k, &l.v}, gate_up = {&l.gate, &l.up};
    if (l.qkv.weight.empty() && stackable(backend, qkv)) {
      l.qkv = fuser.fuse(qkv);
      ++fused;
    }
    if (l.gate_up.weight.empty() && stackable(backend, gate_up) &&
        l.gate.out_features() == l.up.out_features()) {
      l.gate_up = fuser.fuse(gate_up);
      ++fused;
    }
  }
  return fused;
}

}  // namespace inferx
