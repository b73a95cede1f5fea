#pragma once
// An asynchronous HTTP/1.1 server on Boost.Beast + Asio. A small fixed pool of I/O threads serves every
// connection; a waiting or streaming client holds a socket and a little memory, never a thread.
// Keep-alive, a request body size limit, chunked transfer encoding for streams, and disconnect
// detection (a read stays posted while a response is pending, so a client that goes away is noticed even
// before anything is written to it).
#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

namespace inferx::server {

struct HttpRequest {
  std::string method;                          // "GET", "POST", ...
  std::string target;                          // path, with any query string
  std::string path;                            // target without the query string
  std::map<std::string, std::string> headers;  // keys lower-case
  std::string body;
  std::string header(const std::string& lower_name) const {
    auto it = headers.find(lower_name);
    return it == headers.end() ? std::string() : it->second;
  }
};

using HttpHeaders = std::vector<std::pair<std::string, std::string>>;

// The answer channel of one request. Thread-safe: calls from any thread are queued onto the connection's
// I/O strand, in order. Either send() once, or start_stream(), write()*, end(). Calls after the client has
// gone are dropped.
class ResponseSink {
 public:
  virtual ~ResponseSink() = default;
  virtual void send(int status, const std::string& content_type, std::string body,
                    HttpHeaders headers = {}) = 0;
  virtual void start_stream(int status, const std::string& content_type, HttpHeaders headers = {}) = 0;
  virtual void write(std::string data) = 0;  // one chunk of the stream
  virtual void end() = 0;
  // Runs fn on the connection's strand (in order with the writes above); dropped if the connection is gone.
  virtual void post(std::function<void()> fn) = 0;
  // fn runs once, on an I/O thread, if the client disconnects before the response is complete; at once
  // if it already has.
  virtual void on_disconnect(std::function<void()> fn) = 0;
};

using HttpHandler = std::function<void(HttpRequest&&, std::shared_ptr<ResponseSink>)>;

struct HttpServerOptions {
  std::string host = "127.0.0.1";
  int port = 8000;  // 0: any free port (see HttpServer::port())
  int io_threads = 2;
  size_t max_body_bytes = 32u << 20;  // 413 above this
  int keep_alive_seconds = 75;        // an idle connection is closed after this
  int header_timeout_seconds = 30;    // a request must arrive in full within this once started
};

class HttpServer {
 public:
  HttpServer(HttpServerOptions options, HttpHandler handler);
  ~HttpServer();
  HttpServer(const HttpServer&) = delete;
  HttpServer& operator=(const HttpServer&) = delete;

  // Binds and listens; throws inferx::Error naming the address when that fails.
  void listen();
  int port() const;  // the bound port
  // Starts the I/O threads (returns at once).
  void start();
  // Closes the listening socket: new connections are refused; open ones get "Connection: close" after
  // their current response and no further request is read.
  void stop_accepting();
  // Stops the I/O threads and closes every connection; joins.
  void stop();

  int64_t open_connections() const { return open_connections_.load(); }
  // Requests read whose response is not yet fully written (or whose client went away).
  int64_t requests_in_flight() const { return in_flight_.load(); }
  bool accepting() const { return !draining_.load(); }

  struct Impl;

 private:
  // Declared before impl_: sessions destroyed with impl_ still update them.
  std::atomic<int64_t> open_connections_{0};
  std::atomic<int64_t> in_flight_{0};
  std::atomic<bool> draining_{false};
  std::unique_ptr<Impl> impl_;
  friend struct Impl;
  friend class Session;
};

// "HTTP/1.1 <code> <reason>" reason phrase.
const char* http_reason(int status);

}  // namespace inferx::server
