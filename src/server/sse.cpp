#include "server/sse.h"

namespace inferx::server {

std::string sse_event(std::string_view data) {
  std::string out;
  out.reserve(data.size() + 8);
  size_t start = 0;
  while (true) {
    const size_t nl = data.find('\n', start);
    out += "data: ";
    out.append(data.substr(start, nl == std::string_view::npos ? std::string_view::npos : nl - start));
    out += '\n';
    if (nl == std::string_view::npos) break;
    start = nl + 1;
  }
  out += '\n';
  return out;
}

}  // namespace inferx::server
