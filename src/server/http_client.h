#pragma once
// A small asynchronous HTTP/1.1 client (Boost.Beast) for `inferx bench serve`: many concurrent POSTs over
// a pool of keep-alive connections, with Server-Sent Events delivered as they arrive (timestamped on
// arrival, for TTFT / inter-token latency). One I/O thread serves every connection.
#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

namespace inferx::server {

struct ClientResponse {
  int status = 0;      // 0: no response (connection error)
  std::string error;   // transport error text
  std::string body;    // non-SSE body (error responses, non-stream JSON)
  double t_start = 0;  // steady-clock seconds: request handed to the client
  double t_end = 0;    // last byte received
};

class HttpClient {
 public:
  // host must be an IP address (the benchmark talks to a server it was told the address of).
  HttpClient(std::string host, int port);
  ~HttpClient();
  HttpClient(const HttpClient&) = delete;
  HttpClient& operator=(const HttpClient&) = delete;

  // Thread-safe. on_event(data, t) runs on the client thread for every SSE "data:" payload;
  // done runs once at the end.
  void post(const std::string& path, std::string body,
            std::function<void(const std::string&, double)> on_event,
            std::function<void(ClientResponse&&)> done);
  // Sends "Authorization: Bearer KEY" with every request (call before the first request).
  void set_api_key(const std::string& key);
  // Blocking GET (setup calls such as /v1/models); throws inferx::Error on transport errors.
  ClientResponse get(const std::string& path);

  struct Impl;

 private:
  std::shared_ptr<Impl> impl_;
};

// Splits "http://HOST:PORT[/...]" into host and port; throws naming the URL.
void parse_http_url(const std::string& url, std::string& host, int& port);
double steady_seconds();

}  // namespace inferx::server
