// Sensitivity measurement for auto plans (calibration.h).
#include "model/calibration.h"

#include <cstring>
#include <map>

#include "backend/cpu/matmul_cpu.h"
#include "backend/forwarding_backend.h"
#include "core/error.h"
#include "formats/tensor_source.h"
#include "model/model.h"
#include "model/quantized_linear.h"

namespace inferx {

namespace {

// A CPU backend that records the input rows of every matmul whose weight it was told to watch.
class RecordingBackend final : public ForwardingBackend {
 public:
  explicit RecordingBackend(std::unique_ptr<Backend> inner)
      : ForwardingBackend(*inner), owned_(std::move(inner)) {}
  std::map<const void*, std::vector<float>> inputs;  // by weight data pointer: rows of k floats

  void matmul(const Tensor& x, const Linear& w, Tensor& out) override {
    auto it = inputs.find(w.weight.data);
    if (it != inputs.end()) it->second.insert(it->second.end(), x.ptr<float>(), x.ptr<float>() + x.numel());
    ForwardingBackend::matmul(x, w, out);
  }
  // Every projection must go through matmul above to be recorded: no fused q/k/v or gate/up weights.
  bool prefers_fused_projections() const override { return false; }

 private:
  std::unique_ptr<Backend> owned_;
};

std::vector<const Linear*> model_linears(const Model& m) {
  std::vector<const Linear*> v;
  for (const LayerWeights& l : m.weights().layers)
    for (const Linear* p : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down}) v.push_back(p);
  return v;
}

// Relative squared error of the quantized layer's outputs on rows x (m x k).
double output_error(const Linear& base, const Linear& quant, const std::vector<float>& x, int64_t m,
                    ThreadPool& pool) {
  const int64_t n = base.out_features();
  std::vector<float> ref(static_cast<size_t>(m * n)), got(static_cast<size_t>(m * n));
  matmul_cpu(x.data(), m, base, ref.data(), pool);
  matmul_cpu(x.data(), m, quant, got.data(), pool);
  double err = 0, mag = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    err += static_cast<double>(got[i] - ref[i]) * (got[i] - ref[i]);
    mag += static_cast<double>(ref[i]) * ref[i];
  }
  return mag > 0 ? err / mag : 0.0;
}

}  // namespace

CalibrationResult calibrate_auto_plan(const std::string& spec, const std::vector<int32_t>& tokens,
                                      const QuantOptions& options, int threads, int64_t max_rows) {
  INFERX_CHECK(!tokens.empty(), "--quantize auto: the calibration text has no tokens");
  RecordingBackend backend(make_cpu_backend({threads}));
  std::unique_ptr<Model> model = Model::load(spec, backend);
  CalibrationResult r;
  r.layers = linear_layers(model->config());
  const std::vector<const Linear*> lins = model_linears(*model);
  INFERX_CHECK(lins.size() == r.layers.size(), "internal: {} linear layers, {} descriptions", lins.size(),
               r.layers.size());
  for (const Linear* l : lins) backend.inputs[l->weight.data];  // watch
  const int64_t ctx = std::min<int64_t>(static_cast<int64_t>(tokens.size()), 512);
  {
    SequenceRunner runner(*model, ctx);
    runner.step(std::vector<int32_t>(tokens.begin(), tokens.begin() + ctx));
  }
  ThreadPool pool(threads);
  QuantOptions fp8_rule = options, int4_rule = options;
  fp8_rule.kind = PlanKind::Fp8;
  int4_rule.kind = PlanKind::Int4;
  const QuantPlan fp8_plan = make_plan(fp8_rule, r.layers), int4_plan = make_plan(int4_rule, r.layers);
  const TensorSource& src = *model->source();
  for (size_t i = 0; i < lins.size(); ++i) {
    const Linear& base = *lins[i];
    const int64_t k = base.in_features();
    // Evenly spaced rows of everything recorded (deterministic).
    const std::vector<float>& all = backend.inputs[base.weight.data];
    const int64_t rows = static_cast<int64_t>(all.size()) / k, take = std::min(rows, max_rows);
    std::vector<float> x(static_cast<size_t>(take * k));
    for (int64_t j = 0; j < take; ++j) {
      const int64_t row = j * rows / take;
      std::copy(all.begin() + row * k, all.begin() + (row + 1) * k, x.begin() + j * k);
    }
    // Quantize from the model's own weight tensor (works for any source naming).
    std::vector<std::unique_ptr<DeviceBuffer>> owned;
    auto place = [&](DType t, const std::vector<int64_t>& s, const void* p, size_t b) {
      owned.push_back(backend.allocate(b));
      std::memcpy(owned.back()->data(), p, b);
      Tensor out;
      out.dtype = t;
      out.ndim = static_cast<int>(s.size());
      for (size_t d = 0; d < s.size(); ++d) out.shape[d] = s[d];
      out.data = owned.back()->data();
      return out;
    };
    struct OneTensor final : TensorSource {
      TensorEntry e;
      const TensorEntry* find(std::string_view n) const override { return n == e.name ? &e : nullptr; }
      std::vector<std::string> tensor_names() const override { return {e.name}; }
      std::string describe() const override { return "calibration"; }
    } one;
    one.e.name = r.layers[i].name + ".weight";
    one.e.dtype = base.weight.dtype;
    one.e.shape = {base.out_features(), k};
    one.e.data = static_cast<const uint8_t*>(base.weight.data);
    one.e.nbytes = static_cast<uint64_t>(base.weight.nbytes());
    one.e.file = src.describe();
    LayerSensitivity s;
    const Linear f8 = resolve_quantized_linear(one, one.e.name, base.out_features(), k, {},
                                               fp8_plan.layers[i].second, Device::CPU, place);
    s.fp8 = output_error(base, f8, x, take, pool);
    const Linear i4 = resolve_quantized_linear(one, one.e.name, base.out_features(), k, {},
                                               int4_plan.layers[i].second, Device::CPU, place);
    s.int4 = output_error(base, i4, x, take, pool);
    r.sensitivity.push_back(s);
  }
  r.plan = choose_auto_plan(options, r.layers, r.sensitivity);
  return r;
}

}  // namespace inferx
