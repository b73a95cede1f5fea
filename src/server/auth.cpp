#include "server/auth.h"

namespace inferx::server {

bool is_authorized(const HttpRequest& request, const std::string& api_key) {
  if (api_key.empty()) return true;
  const std::string h = request.header("authorization");
  const std::string prefix = "Bearer ";
  if (h.size() < prefix.size() || h.compare(0, prefix.size(), prefix) != 0) return false;
  const std::string given = h.substr(prefix.size());
  unsigned char diff = given.size() == api_key.size() ? 0 : 1;
  for (size_t i = 0; i < given.size(); ++i)
    diff |= static_cast<unsigned char>(given[i] ^ api_key[i % api_key.size()]);
  return diff == 0;
}

}  // namespace inferx::server
