#pragma once
// Server-Sent Events framing (WHATWG HTML, "server-sent events": an event is "data: <line>" lines ended by
// a blank line). OpenAI streams one JSON object per event and ends with the literal "data: [DONE]".
#include <string>
#include <string_view>

namespace inferx::server {

// One event carrying `data`. A payload with newlines becomes several data: lines, which a client joins
// back with '\n' (the spec's field rule); JSON from our serialiser never contains raw newlines.
std::string sse_event(std::string_view data);
// The terminator OpenAI sends after the last chunk.
inline std::string sse_done() { return "data: [DONE]\n\n"; }

}  // namespace inferx::server
