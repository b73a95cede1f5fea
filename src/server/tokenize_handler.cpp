// POST /tokenize and /detokenize (vLLM's extensions of the OpenAI API): the served model's tokenizer and
// chat template, so a client can count a prompt's tokens or turn ids back into text the way the server does.
//   /tokenize   {"model", "prompt": "text", "add_special_tokens": true}
//            or {"model", "messages": [...], "add_generation_prompt": true, "tools": [...]}
//            -> {"count", "max_model_len", "tokens": [ids], "token_strs": [pieces] | null
//            ("return_token_strs")}
//   /detokenize {"model", "tokens": [ids]} -> {"prompt": "text"}
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "server/api_server.h"
#include "server/openai/api_error.h"
#include "server/openai/request.h"
#include "server/openai/response.h"
#include "text/tokenizer.h"

namespace inferx::server {

using nlohmann::json;

void ApiServer::handle_tokenize(HttpRequest&& req, const std::shared_ptr<ResponseSink>& sink,
                                bool detokenize) {
  const std::string route = detokenize ? "/detokenize" : "/tokenize";
  const nlohmann::ordered_json body = parse_request_body(req.body);
  if (!body.is_object()) bad_request("", "the request body must be a JSON object", "invalid_type");
  auto model = body.find("model");  // optional here
  if (model != body.end() && !model->is_null())
    require_served_model(model->is_string() ? model->get<std::string>() : model->dump());
  if (!model_.tokenizer) bad_request("", "this model has no tokenizer");
  const Tokenizer& tok = *model_.tokenizer;

  if (detokenize) {
    auto tokens = body.find("tokens");
    if (tokens == body.end() || !tokens->is_array())
      bad_request("tokens", "'tokens' must be an array of token ids", "invalid_type");
    std::vector<int32_t> ids;
    for (const auto& t : *tokens) {
      if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= tok.vocab_size())
        bad_request("tokens", fmt::format("'tokens' must hold token ids in [0, {}), got {}", tok.vocab_size(),
                                          t.dump()));
      ids.push_back(static_cast<int32_t>(t.get<int64_t>()));
    }
    return reply_json(sink, route, 200, dump_json({{"prompt", tok.decode(ids)}}));
  }

  std::vector<int32_t> ids;
  if (body.contains("messages")) {
    nlohmann::ordered_json with_model = body;  // "model" is optional here
    with_model["model"] = options_.served_model_name;
    ParsedRequest chat =
        parse_chat_request(with_model);  // the same validation and template as chat completions
    ids = tokenize_chat(chat, get_bool(body, "add_generation_prompt", true));
  } else {
    auto prompt = body.find("prompt");
    if (prompt == body.end() || !prompt->is_string())
      bad_request("prompt", "'prompt' (a string) or 'messages' is required", "missing_required_parameter");
    const bool special = get_bool(body, "add_special_tokens", true);
    ids = tok.encode(prompt->get<std::string>(), special && model_.add_bos);
  }
  json out = {{"count", ids.size()}, {"max_model_len", model_.engine->max_model_len()}, {"tokens", ids}};
  if (get_bool(body, "return_token_strs", false)) {
    json strs = json::array();
    for (int32_t id : ids) strs.push_back(tok.piece(id));
    out["token_strs"] = strs;
  } else {
    out["token_strs"] = nullptr;
  }
  reply_json(sink, route, 200, dump_json(out));
}

}  // namespace inferx::server
