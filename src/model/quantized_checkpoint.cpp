// The InferX quantized checkpoint writer (layout: docs/quantized-checkpoint.md).
#include "model/quantized_checkpoint.h"

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "core/error.h"
#include "core/text_file.h"
#include "formats/json_text.h"
#include "formats/safetensors.h"
#include "model/quantized_linear.h"

namespace inferx {

namespace {

namespace fs = std::filesystem;

std::vector<int64_t> dims(const Tensor& t) {
  return std::vector<int64_t>(t.shape.begin(), t.shape.begin() + t.ndim);
}

}  // namespace

void write_quantized_checkpoint(const std::string& source_dir, const Model& model,
                                const std::string& out_dir) {
  INFERX_CHECK(
      fs::is_directory(source_dir) && fs::exists(fs::path(source_dir) / "config.json"),
      "quantize: {} is not a Hugging Face model folder (config.json + *.safetensors); GGUF files are "
      "quantized with their own types",
      source_dir);
  INFERX_CHECK(model.backend().device() == Device::CPU, "quantize: load the model on the CPU backend");
  std::error_code ec;
  INFERX_CHECK(!fs::exists(out_dir) || !fs::equivalent(out_dir, source_dir, ec),
               "quantize: --out {} is the source folder", out_dir);
  if (fs::exists(out_dir, ec)) {
    INFERX_CHECK(fs::is_directory(out_dir, ec), "quantize: --out {} exists and is not a folder", out_dir);
    // The loader prefers an index over model.safetensors: a folder that holds another checkpoint's shards
    // would load them instead of (or mixed with) the one written here. Our own earlier output is replaced.
    for (const auto& entry : fs::directory_iterator(out_dir, ec)) {
      const std::string fname = entry.path().filename().string();
      INFERX_CHECK(
          fname != "model.safetensors.index.json" &&
              (entry.path().extension() != ".safetensors" || fname == "model.safetensors"),
          "quantize: --out {} already holds another checkpoint ({}), which would be loaded instead of "
          "the one written; give an empty or new folder",
          out_dir, fname);
    }
  }
  fs::create_directories(out_dir, ec);
  INFERX_CHECK(!ec, "quantize: cannot create --out {}: {}", out_dir, ec.message());

  const TensorSource& src = *model.source();
  const std::vector<LinearDesc> descs = linear_layers(model.config());
  std::vector<const Linear*> layer_lins;
  for (const LayerWeights& l : model.weights().layers)
    for (const Linear* p : {&l.q, &l.k, &l.v, &l.o, &l.gate, &l.up, &l.down}) layer_lins.push_back(p);
  INFERX_CHECK(layer_lins.size() == descs.size(), "internal: {} linear layers for {} descriptions",
               layer_lins.size(), descs.size());
  std::vector<std::pair<std::string, const Linear*>> lins;  // module path, layer
  for (size_t i = 0; i < descs.size(); ++i) lins.emplace_back(descs[i].name, layer_lins[i]);
  // A quantized lm_head ("--quantize PLAN:lm_head") is written as lm_head.weight, also when the source ties
  // it to the embedding (which stays as stored): the loader prefers a present lm_head.weight.
  lins.emplace_back(lm_head_desc(model.config()).name, &model.weights().lm_head);

  SafetensorsWriter w;
  std::set<std::string> written;
  for (const auto& [p, lp] : lins) {
    const Linear& l = *lp;
    const DType t = l.weight.dtype;
    if (t != DType::F8_E4M3 && t != DType::INT4) continue;  // copied below as stored
    INFERX_CHECK(l.input_perm.empty(),
                 "quantize: {} is an act-order GPTQ layer; re-saving those is not supported", p);
    if (t == DType::F8_E4M3) {
      w.add_tensor(p + ".weight", DType::F8_E4M3, dims(l.weight), l.weight.data,
                   static_cast<uint64_t>(l.weight.nbytes()));
      w.add_tensor(p + ".weight_scale", DType::F32, dims(l.scale), l.scale.data,
                   static_cast<uint64_t>(l.scale.nbytes()));
    } else {
      const int64_t n = l.out_features(), k = l.in_features();
      w.add_tensor(p + ".weight", DType::U8, {n, k / 2}, l.weight.data, static_cast<uint64_t>(n * k / 2));
      w.add_tensor(p + ".weight_scale", DType::F16, dims(l.scale), l.scale.data,
                   static_cast<uint64_t>(l.scale.nbytes()));
      if (!l.zero.empty())
        w.add_tensor(p + ".weight_zero_point", DType::U8, dims(l.zero), l.zero.data,
                     static_cast<uint64_t>(l.zero.nbytes()));
    }
    written.insert(p + ".weight");
    // Any pre-quantized companions of the source layer are superseded.
    for (const char* s :
         {".qweight", ".qzeros", ".scales", ".g_idx", ".weight_scale", ".weight_zero_point", ".input_scale"})
      written.insert(p + s);
  }
  for (const std::string& name : src.tensor_names()) {
    if (written.count(name)) continue;
    const TensorEntry* e = src.find(name);
    INFERX_CHECK(e->dtype != DType::INT4, "quantize: tensor '{}' has no safetensors type", name);
    w.add_tensor(name, e->dtype, e->shape, e->data, e->nbytes);
  }
  const std::string plan_json = model.quant_plan().to_json();
  w.set_metadata("format", "pt");
  w.set_metadata("inferx.quantization_plan", plan_json);
  w.write((fs::path(out_dir) / "model.safetensors").string());

  // config.json with our quantization_config; other files copied (tokenizer, generation config...).
  const fs::path cfg_path = fs::path(source_dir) / "config.json";
  nlohmann::ordered_json cfg = parse_ordered_json_text(
      read_text_file(cfg_path.string(), "the model's config.json"), cfg_path.string());
  cfg["quantization_config"] = {{"quant_method", "inferx"},
                                {"plan", nlohmann::ordered_json::parse(plan_json)}};
  std::ofstream out(fs::path(out_dir) / "config.json");
  out << cfg.dump(2) << "\n";
  INFERX_CHECK(out.good(), "quantize: cannot write {}/config.json", out_dir);
  for (const auto& entry : fs::directory_iterator(source_dir)) {
    const std::string fname = entry.path().filename().string();
    if (!entry.is_regular_file() || fname == "config.json" || entry.path().extension() == ".safetensors" ||
        fname == "model.safetensors.index.json")
      continue;
    fs::copy_file(entry.path(), fs::path(out_dir) / fname, fs::copy_options::overwrite_existing, ec);
    INFERX_CHECK(!ec, "quantize: cannot copy {} to {}: {}", entry.path().string(), out_dir, ec.message());
  }
}

}  // namespace inferx
