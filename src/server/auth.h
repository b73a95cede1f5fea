#pragma once
// Optional API key (--api-key): clients send "Authorization: Bearer <key>", as the OpenAI clients do.
#include <string>

#include "server/http_server.h"

namespace inferx::server {

// True when no key is configured or the request carries it. The comparison takes the same time
// wherever the first difference is, so response timing does not reveal a prefix of the key.
bool is_authorized(const HttpRequest& request, const std::string& api_key);

}  // namespace inferx::server
