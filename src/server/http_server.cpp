#include "server/http_server.h"

#include <fmt/format.h>

#include <algorithm>
#include <boost/asio/dispatch.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/asio/steady_timer.hpp>
#include <boost/asio/strand.hpp>
#include <boost/asio/write.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <deque>
#include <mutex>
#include <optional>
#include <thread>

#include "core/error.h"

namespace inferx::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;

const char* http_reason(int status) {
  auto r = http::obsolete_reason(http::int_to_status(static_cast<unsigned>(status)));
  return r.empty() ? "Unknown" : r.data();  // obsolete_reason returns literals: NUL-terminated
}

struct HttpServer::Impl {
  HttpServerOptions options;
  HttpHandler handler;
  net::io_context ioc;
  tcp::acceptor acceptor{net::make_strand(ioc)};  // accept and close serialised on one strand
  std::vector<std::thread> threads;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  int port = 0;
  HttpServer* owner = nullptr;
};

class Session;

// The ResponseSink of one request; forwards to its session on the session's strand.
class SinkImpl : public ResponseSink, public std::enable_shared_from_this<SinkImpl> {
 public:
  SinkImpl(std::weak_ptr<Session> session, net::any_io_executor strand)
      : session_(std::move(session)), strand_(std::move(strand)) {}

  void send(int status, const std::string& content_type, std::string body, HttpHeaders headers) override;
  void start_stream(int status, const std::string& content_type, HttpHeaders headers) override;
  void write(std::string data) override;
  void end() override;
  void post(std::function<void()> fn) override;
  void on_disconnect(std::function<void()> fn) override {
    std::unique_lock lock(mu_);
    if (disconnected_) {
      lock.unlock();
      fn();
      return;
    }
    on_disconnect_ = std::move(fn);
  }
  // Session side (strand).
  void notify_disconnect() {
    std::function<void()> fn;
    {
      std::lock_guard lock(mu_);
      if (disconnected_) return;
      disconnected_ = true;
      fn = std::move(on_disconnect_);
    }
    if (fn) fn();
  }
  void mark_complete() {
    std::lock_guard lock(mu_);
    disconnected_ = true;  // nothing to abort any more; a later on_disconnect() registration must not fire
    on_disconnect_ = nullptr;
  }

 private:
  template <class F>
  void run(F&& f);
  std::weak_ptr<Session> session_;
  net::any_io_executor strand_;  // the connection's strand (its socket's executor)
  std::mutex mu_;
  bool disconnected_ = false;
  std::function<void()> on_disconnect_;
};

class Session : public std::enable_shared_from_this<Session> {
 public:
  Session(tcp::socket&& socket, HttpServer::Impl& server)
      : strand_(socket.get_executor()), stream_(std::move(socket)), server_(server), idle_timer_(strand_) {
    server_.owner->open_connections_ += 1;
  }
  ~Session() {
    server_.owner->open_connections_ -= 1;
    if (pending_response_) server_.owner->in_flight_ -= 1;
  }

  void start() {
    // Adopt a strand for this connection: every handler of this session runs serialised on it.
    net::dispatch(strand_, [self = shared_from_this()] { self->read_request(); });
  }

  // --- called on the strand by SinkImpl ---------------------------------------------------------------
  void send(int status, const std::string& content_type, std::string body, const HttpHeaders& headers) {
    if (!pending_response_ || started_) return;
    started_ = true;
    std::string head = status_head(status, headers);
    head += fmt::format("Content-Type: {}\r\nContent-Length: {}\r\n\r\n", content_type, body.size());
    queue(std::move(head));
    queue(std::move(body));
    response_done_ = true;
    flush();
  }
  void start_stream(int status, const std::string& content_type, const HttpHeaders& headers) {
    if (!pending_response_ || started_) return;
    started_ = true;
    std::string head = status_head(status, headers);
    head += fmt::format("Content-Type: {}\r\nCache-Control: no-cache\r\nTransfer-Encoding: chunked\r\n\r\n",
                        content_type);
    queue(std::move(head));
    flush();
  }
  void write_chunk(std::string data) {
    if (!pending_response_ || !started_ || response_done_ || data.empty()) return;
    queue(fmt::format("{:x}\r\n", data.size()));  // RFC 9112 section 7.1: chunk-size in hex, CRLF, data, CRLF
    data += "\r\n";
    queue(std::move(data));
    flush();
  }
  void end_stream() {
    if (!pending_response_ || !started_ || response_done_) return;
    queue("0\r\n\r\n");
    response_done_ = true;
    flush();
  }
  bool alive() const { return !closed_; }

 private:
  std::string status_head(int status, const HttpHeaders& headers) {
    keep_alive_ = keep_alive_ && server_.owner->accepting();
    std::string h = fmt::format("HTTP/1.1 {} {}\r\nServer: inferx\r\nConnection: {}\r\n", status,
                                http_reason(status), keep_alive_ ? "keep-alive" : "close");
    for (const auto& [k, v] : headers) h += fmt::format("{}: {}\r\n", k, v);
    return h;
  }

  void read_request() {
    if (closed_) return;
    idle_timer_.cancel();
    if (!server_.owner->accepting()) return close();
    parser_.emplace();
    parser_->body_limit(server_.options.max_body_bytes);
    parser_->header_limit(64 * 1024);
    stream_.expires_after(std::chrono::seconds(buffer_.size() ? server_.options.header_timeout_seconds
                                                              : server_.options.keep_alive_seconds));
    http::async_read(stream_, buffer_, *parser_,
                     beast::bind_front_handler(&Session::on_read, shared_from_this()));
  }

  void on_read(beast::error_code ec, size_t) {
    if (ec == http::error::body_limit) {
      // Answer 413 and close: the rest of the body is not read.
      return reply_and_close(
          413, fmt::format("request body exceeds the limit of {} bytes", server_.options.max_body_bytes));
    }
    if (ec == http::error::end_of_stream || ec == net::error::eof || ec == beast::error::timeout)
      return close();
    if (ec) {
      if (std::string_view(ec.category().name()) == "beast.http") return reply_and_close(400, ec.message());
      return close();
    }
    stream_.expires_never();  // a stream may legitimately last long; disconnects are caught by the probe
    auto msg = parser_->release();
    HttpRequest req;
    req.method = std::string(msg.method_string());
    req.target = std::string(msg.target());
    req.path = req.target.substr(0, req.target.find('?'));
    for (const auto& f : msg) {
      std::string k(f.name_string());
      std::transform(k.begin(), k.end(), k.begin(),
                     [](unsigned char c) { return static_cast<char>(std::tolower(c)); });
      req.headers[k] = std::string(f.value());
    }
    req.body = std::move(msg.body());
    keep_alive_ = msg.keep_alive();
    pending_response_ = true;
    started_ = response_done_ = false;
    server_.owner->in_flight_ += 1;
    sink_ = std::make_shared<SinkImpl>(weak_from_this(), strand_);
    probe();
    try {
      server_.handler(std::move(req), sink_);
    } catch (const std::exception&) {
      send(
          500, "application/json",
          fmt::format(
              R"({{"error": {{"message": "internal error", "type": "internal_error", "param": null, "code": null}}}})"),
          {});
    }
  }

  // A read posted while the response is pending: EOF or an error means the client went away (the
  // request is aborted); bytes are the next pipelined request and stay in buffer_.
  void probe() {
    if (probing_ || closed_) return;
    probing_ = true;
    stream_.async_read_some(buffer_.prepare(4096),
                            beast::bind_front_handler(&Session::on_probe, shared_from_this()));
  }

  void on_probe(beast::error_code ec, size_t n) {
    probing_ = false;
    if (ec) {
      if (pending_response_ && sink_) sink_->notify_disconnect();
      return close();
    }
    buffer_.commit(n);
    if (!pending_response_) read_request();  // idle keep-alive connection: this is the next request
  }

  void queue(std::string s) { out_.push_back(std::move(s)); }

  void flush() {
    if (writing_ || closed_) return;
    if (out_.empty()) {
      if (response_done_ && pending_response_) finish_response();
      return;
    }
    writing_ = true;
    net::async_write(stream_, net::buffer(out_.front()),
                     beast::bind_front_handler(&Session::on_write, shared_from_this()));
  }

  void on_write(beast::error_code ec, size_t) {
    writing_ = false;
    if (ec) {
      if (pending_response_ && sink_) sink_->notify_disconnect();
      return close();
    }
    out_.pop_front();
    flush();
  }

  void finish_response() {
    pending_response_ = false;
    server_.owner->in_flight_ -= 1;
    if (sink_) sink_->mark_complete();
    sink_.reset();
    if (!keep_alive_) return close();
    // Idle until the next request: the probe (still posted, or restarted here) delivers its first bytes.
    if (buffer_.size() > 0 && !probing_) return read_request();
    idle_timer_.expires_after(std::chrono::seconds(server_.options.keep_alive_seconds));
    idle_timer_.async_wait([self = shared_from_this()](beast::error_code ec) {
      if (!ec && !self->pending_response_) self->close();
    });
    probe();
  }

  void reply_and_close(int status, const std::string& message) {
    keep_alive_ = false;
    if (!pending_response_) {
      pending_response_ = true;
      server_.owner->in_flight_ += 1;
    }
    started_ = false;
    send(
        status, "application/json",
        fmt::format(
            R"({{"error": {{"message": "{}", "type": "invalid_request_error", "param": null, "code": null}}}})",
            message),
        {});
  }

  void close() {
    if (closed_) return;
    closed_ = true;
    beast::error_code ec;
    idle_timer_.cancel();
    stream_.socket().shutdown(tcp::socket::shutdown_both, ec);
    stream_.close();
    if (pending_response_) {
      if (sink_) sink_->notify_disconnect();
      pending_response_ = false;
      server_.owner->in_flight_ -= 1;
    }
    sink_.reset();
  }

  net::any_io_executor strand_;  // the accepted socket's strand: every handler of this session runs on it
  beast::tcp_stream stream_;
  HttpServer::Impl& server_;
  net::steady_timer idle_timer_;  // closes an idle keep-alive connection (the probe read has no timeout)
  beast::flat_buffer buffer_;
  std::optional<http::request_parser<http::string_body>> parser_;
  std::deque<std::string> out_;
  std::shared_ptr<SinkImpl> sink_;
  bool writing_ = false, probing_ = false, closed_ = false;
  bool pending_response_ = false, started_ = false, response_done_ = false, keep_alive_ = false;
};

template <class F>
void SinkImpl::run(F&& f) {
  net::post(strand_, [weak = session_, f = std::forward<F>(f)]() mutable {
    if (auto s = weak.lock(); s && s->alive()) f(*s);
  });
}

void SinkImpl::send(int status, const std::string& content_type, std::string body, HttpHeaders headers) {
  run([=, body = std::move(body), headers = std::move(headers)](Session& s) mutable {
    s.send(status, content_type, std::move(body), headers);
  });
}
void SinkImpl::start_stream(int status, const std::string& content_type, HttpHeaders headers) {
  run([=, headers = std::move(headers)](Session& s) { s.start_stream(status, content_type, headers); });
}
void SinkImpl::write(std::string data) {
  run([data = std::move(data)](Session& s) mutable { s.write_chunk(std::move(data)); });
}
void SinkImpl::end() {
  run([](Session& s) { s.end_stream(); });
}
void SinkImpl::post(std::function<void()> fn) {
  run([fn = std::move(fn)](Session&) { fn(); });
}

namespace {

void do_accept(HttpServer::Impl& impl) {
  impl.acceptor.async_accept(net::make_strand(impl.ioc), [&impl](beast::error_code ec, tcp::socket socket) {
    if (ec == net::error::operation_aborted || !impl.acceptor.is_open()) return;
    if (!ec) {
      beast::error_code ignored;
      socket.set_option(tcp::no_delay(true), ignored);  // SSE chunks are small: do not let Nagle hold them
      std::make_shared<Session>(std::move(socket), impl)->start();
    }
    do_accept(impl);
  });
}

}  // namespace

HttpServer::HttpServer(HttpServerOptions options, HttpHandler handler) : impl_(std::make_unique<Impl>()) {
  impl_->options = std::move(options);
  impl_->handler = std::move(handler);
  impl_->owner = this;
}

HttpServer::~HttpServer() { stop(); }

void HttpServer::listen() {
  beast::error_code ec;
  auto addr = net::ip::make_address(impl_->options.host, ec);
  if (ec) fail("--host: '{}' is not an IP address ({})", impl_->options.host, ec.message());
  tcp::endpoint ep(addr, static_cast<unsigned short>(impl_->options.port));
  auto& a = impl_->acceptor;
  a.open(ep.protocol(), ec);
  if (!ec) a.set_option(net::socket_base::reuse_address(true), ec);
  if (!ec) a.bind(ep, ec);
  if (!ec) a.listen(net::socket_base::max_listen_connections, ec);
  if (ec) fail("cannot listen on {}:{}: {}", impl_->options.host, impl_->options.port, ec.message());
  impl_->port = a.local_endpoint().port();
}

int HttpServer::port() const { return impl_->port; }

void HttpServer::start() {
  INFERX_CHECK(impl_->acceptor.is_open(), "HttpServer::start() before listen()");
  impl_->work.emplace(net::make_work_guard(impl_->ioc));
  do_accept(*impl_);
  const int n = std::max(1, impl_->options.io_threads);
  for (int i = 0; i < n; ++i) impl_->threads.emplace_back([this] { impl_->ioc.run(); });
}

void HttpServer::stop_accepting() {
  draining_ = true;
  net::post(impl_->acceptor.get_executor(), [this] {
    beast::error_code ec;
    impl_->acceptor.close(ec);
  });
}

void HttpServer::stop() {
  if (!impl_) return;
  draining_ = true;
  impl_->work.reset();
  impl_->ioc.stop();
  for (auto& t : impl_->threads) t.join();
  impl_->threads.clear();
}

}  // namespace inferx::server
