#pragma once
// OpenAI-style API errors: an HTTP status plus the body
//   {"error": {"message": ..., "type": ..., "param": ..., "code": ...}}
// (OpenAI API reference, "Error codes"; the Python client raises BadRequestError etc. from it).
#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

namespace inferx::server {

class ApiError : public std::runtime_error {
 public:
  ApiError(int status, std::string message, std::string param = {}, std::string code = {},
           std::string type = "invalid_request_error")
      : std::runtime_error(message),
        status(status),
        param(std::move(param)),
        code(std::move(code)),
        type(std::move(type)) {}
  int status;
  std::string param, code, type;

  nlohmann::json body() const {
    nlohmann::json e = {{"message", what()}, {"type", type}};
    e["param"] = param.empty() ? nlohmann::json(nullptr) : nlohmann::json(param);
    e["code"] = code.empty() ? nlohmann::json(nullptr) : nlohmann::json(code);
    return {{"error", e}};
  }
};

// 400 naming the offending field.
[[noreturn]] inline void bad_request(const std::string& param, const std::string& message,
                                     const std::string& code = "invalid_value") {
  throw ApiError(400, message, param, code);
}

}  // namespace inferx::server
