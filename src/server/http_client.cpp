#include "server/http_client.h"

#include <fmt/format.h>

#include <boost/asio/connect.hpp>
#include <boost/asio/io_context.hpp>
#include <boost/asio/ip/tcp.hpp>
#include <boost/asio/post.hpp>
#include <boost/beast/core.hpp>
#include <boost/beast/http.hpp>
#include <chrono>
#include <future>
#include <mutex>
#include <optional>
#include <thread>

#include "core/error.h"

namespace inferx::server {

namespace net = boost::asio;
namespace beast = boost::beast;
namespace http = boost::beast::http;
using tcp = net::ip::tcp;

double steady_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

void parse_http_url(const std::string& url, std::string& host, int& port) {
  const std::string scheme = "http://";
  INFERX_CHECK(url.rfind(scheme, 0) == 0, "--url '{}': only http://HOST:PORT is supported", url);
  std::string rest = url.substr(scheme.size());
  rest = rest.substr(0, rest.find('/'));
  const size_t colon = rest.rfind(':');
  host = colon == std::string::npos ? rest : rest.substr(0, colon);
  port = 80;
  if (colon != std::string::npos) {
    try {
      port = std::stoi(rest.substr(colon + 1));
    } catch (const std::exception&) {
      fail("--url '{}': bad port", url);
    }
  }
  if (host == "localhost") host = "127.0.0.1";
}

struct HttpClient::Impl : std::enable_shared_from_this<HttpClient::Impl> {
  net::io_context ioc;
  std::optional<net::executor_work_guard<net::io_context::executor_type>> work;
  std::thread thread;
  tcp::endpoint endpoint;
  std::string host_header;
  std::string authorization;
  std::vector<std::unique_ptr<beast::tcp_stream>> idle;  // keep-alive pool (client thread only)
};

namespace {

// One request on one connection; runs entirely on the client thread.
class Exchange : public std::enable_shared_from_this<Exchange> {
 public:
  Exchange(HttpClient::Impl& impl, http::request<http::string_body> req,
           std::function<void(const std::string&, double)> on_event,
           std::function<void(ClientResponse&&)> done)
      : impl_(impl), req_(std::move(req)), on_event_(std::move(on_event)), done_(std::move(done)) {
    res_.t_start = steady_seconds();
  }

  void start() {
    if (!impl_.idle.empty()) {
      stream_ = std::move(impl_.idle.back());
      impl_.idle.pop_back();
      reused_ = true;
      return send();
    }
    connect();
  }

 private:
  void connect() {
    reused_ = false;
    stream_ = std::make_unique<beast::tcp_stream>(impl_.ioc);
    stream_->async_connect(impl_.endpoint, [self = shared_from_this()](beast::error_code ec) {
      if (ec) return self->finish(fmt::format("connect: {}", ec.message()));
      beast::error_code ignored;
      self->stream_->socket().set_option(tcp::no_delay(true), ignored);
      self->send();
    });
  }

  void send() {
    http::async_write(*stream_, req_, [self = shared_from_this()](beast::error_code ec, size_t) {
      if (ec) return self->retry_or_finish(fmt::format("write: {}", ec.message()));
      self->read_header();
    });
  }

  // A pooled connection the server closed meanwhile fails at once: reconnect once.
  void retry_or_finish(const std::string& error) {
    if (reused_ && !got_bytes_) return connect();
    finish(error);
  }

  void read_header() {
    parser_.emplace();
    parser_->body_limit(1ull << 32);
    // Beast keeps a reference to the callback: it must outlive the parser (a member).
    chunk_cb_ = [this](uint64_t, beast::string_view data, beast::error_code&) -> size_t {
      fed_chunks_ = true;
      feed(std::string_view(data.data(), data.size()));
      return data.size();
    };
    parser_->on_chunk_body(chunk_cb_);
    http::async_read_header(*stream_, buffer_, *parser_,
                            [self = shared_from_this()](beast::error_code ec, size_t) {
                              if (ec) return self->retry_or_finish(fmt::format("read: {}", ec.message()));
                              self->got_bytes_ = true;
                              self->res_.status = static_cast<int>(self->parser_->get().result_int());
                              self->read_body();
                            });
  }

  void read_body() {
    if (parser_->is_done()) return done_reading();
    http::async_read_some(*stream_, buffer_, *parser_,
                          [self = shared_from_this()](beast::error_code ec, size_t) {
                            if (ec) return self->finish(fmt::format("read: {}", ec.message()));
                            self->read_body();
                          });
  }

  // SSE framing (WHATWG server-sent events): events end with a blank line; each "data:" line (one optional
  // space after the colon) is a payload. Lines may end in CR LF (sse-starlette's default): CRs are dropped,
  // which cannot touch a JSON payload (JSON escapes them inside strings).
  void feed(std::string_view data) {
    const double t = steady_seconds();
    for (char c : data)
      if (c != '\r') pending_.push_back(c);
    size_t end;
    while ((end = pending_.find("\n\n")) != std::string::npos) {
      std::string_view event(pending_.data(), end);
      size_t pos = 0;
      while (pos <= event.size()) {
        size_t nl = event.find('\n', pos);
        if (nl == std::string_view::npos) nl = event.size();
        std::string_view line = event.substr(pos, nl - pos);
        if (line.rfind("data:", 0) == 0 && on_event_) {
          line.remove_prefix(5);
          if (!line.empty() && line.front() == ' ') line.remove_prefix(1);
          on_event_(std::string(line), t);
        }
        pos = nl + 1;
      }
      pending_.erase(0, end + 2);
    }
  }

  void done_reading() {
    // An event stream sent with a Content-Length instead of chunks (legal HTTP) arrives as one body: its
    // events are delivered here, all at its end.
    if (!fed_chunks_ && parser_->get()[http::field::content_type].starts_with("text/event-stream"))
      feed(parser_->get().body());
    res_.body = std::move(parser_->get().body());
    keep_ = parser_->get().keep_alive();
    finish({});
  }

  void finish(const std::string& error) {
    if (finished_) return;
    finished_ = true;
    res_.error = error;
    res_.t_end = steady_seconds();
    if (error.empty() && keep_ && stream_) impl_.idle.push_back(std::move(stream_));
    if (done_) done_(std::move(res_));
  }

  HttpClient::Impl& impl_;
  http::request<http::string_body> req_;
  std::function<void(const std::string&, double)> on_event_;
  bool fed_chunks_ = false;
  std::function<void(ClientResponse&&)> done_;
  std::unique_ptr<beast::tcp_stream> stream_;
  beast::flat_buffer buffer_;
  std::function<size_t(uint64_t, beast::string_view, beast::error_code&)> chunk_cb_;
  std::optional<http::response_parser<http::string_body>> parser_;
  std::string pending_;
  ClientResponse res_;
  bool reused_ = false, got_bytes_ = false, keep_ = false, finished_ = false;
};

}  // namespace

HttpClient::HttpClient(std::string host, int port) : impl_(std::make_shared<Impl>()) {
  beast::error_code ec;
  auto addr = net::ip::make_address(host, ec);
  INFERX_CHECK(!ec, "'{}' is not an IP address", host);
  impl_->endpoint = tcp::endpoint(addr, static_cast<unsigned short>(port));
  impl_->host_header = fmt::format("{}:{}", host, port);
  impl_->work.emplace(net::make_work_guard(impl_->ioc));
  impl_->thread = std::thread([impl = impl_.get()] { impl->ioc.run(); });
}

HttpClient::~HttpClient() {
  impl_->work.reset();
  impl_->ioc.stop();
  impl_->thread.join();
}

void HttpClient::set_api_key(const std::string& key) {
  impl_->authorization = key.empty() ? std::string() : "Bearer " + key;
}

void HttpClient::post(const std::string& path, std::string body,
                      std::function<void(const std::string&, double)> on_event,
                      std::function<void(ClientResponse&&)> done) {
  http::request<http::string_body> req{http::verb::post, path, 11};
  req.set(http::field::host, impl_->host_header);
  req.set(http::field::content_type, "application/json");
  if (!impl_->authorization.empty()) req.set(http::field::authorization, impl_->authorization);
  req.keep_alive(true);
  req.body() = std::move(body);
  req.prepare_payload();
  net::post(impl_->ioc, [impl = impl_.get(), req = std::move(req), on_event = std::move(on_event),
                         done = std::move(done)]() mutable {
    std::make_shared<Exchange>(*impl, std::move(req), std::move(on_event), std::move(done))->start();
  });
}

ClientResponse HttpClient::get(const std::string& path) {
  http::request<http::string_body> req{http::verb::get, path, 11};
  req.set(http::field::host, impl_->host_header);
  if (!impl_->authorization.empty()) req.set(http::field::authorization, impl_->authorization);
  req.keep_alive(true);
  std::promise<ClientResponse> p;
  auto f = p.get_future();
  net::post(impl_->ioc, [this, req = std::move(req), &p]() mutable {
    std::make_shared<Exchange>(*impl_, std::move(req), nullptr, [&p](ClientResponse&& r) {
      p.set_value(std::move(r));
    })->start();
  });
  ClientResponse r = f.get();
  INFERX_CHECK(r.error.empty(), "GET {}: {}", path, r.error);
  return r;
}

}  // namespace inferx::server
