// KV events over ZeroMQ (see kv_events.h for the wire format and what it was matched against).
#include "server/kv_events.h"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <msgpack.hpp>
#include <zmq.hpp>

#include "kvq/log.h"

namespace kvq::server {
namespace {

struct Event {
  enum Kind { kStored, kRemoved, kCleared } kind = kCleared;
  std::vector<uint64_t> hashes;
  std::optional<uint64_t> parent;
  std::vector<int32_t> token_ids;
  int32_t block_size = 0;
  std::string medium;
};

std::string SequenceBytes(int64_t seq) {  // 8 bytes, big-endian, two's complement
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[7 - i] = static_cast<char>((static_cast<uint64_t>(seq) >> (8 * i)) & 0xff);
  return out;
}

std::string Encode(const std::vector<Event>& events) {
  msgpack::sbuffer buffer;
  msgpack::packer<msgpack::sbuffer> pk(buffer);
  pk.pack_array(2);
  const auto now = std::chrono::system_clock::now().time_since_epoch();
  pk.pack_double(std::chrono::duration<double>(now).count());
  pk.pack_array(static_cast<uint32_t>(events.size()));
  for (const Event& e : events) {
    switch (e.kind) {
      case Event::kStored:
        pk.pack_array(7);
        pk.pack(std::string("BlockStored"));
        pk.pack(e.hashes);
        if (e.parent) {
          pk.pack(*e.parent);
        } else {
          pk.pack_nil();
        }
        pk.pack(e.token_ids);
        pk.pack(e.block_size);
        pk.pack_nil();  // lora_id: kvq serves no adapters
        pk.pack(e.medium);
        break;
      case Event::kRemoved:
        pk.pack_array(3);
        pk.pack(std::string("BlockRemoved"));
        pk.pack(e.hashes);
        pk.pack(e.medium);
        break;
      case Event::kCleared:
        pk.pack_array(1);
        pk.pack(std::string("AllBlocksCleared"));
        break;
    }
  }
  return std::string(buffer.data(), buffer.size());
}

}  // namespace

struct KvEventPublisher::Impl {
  KvEventsOptions options;
  Metrics* metrics = nullptr;
  zmq::context_t context{1};
  // XPUB rather than PUB: the same wire behaviour for subscribers, and the sending thread sees each
  // subscription arrive (counted in /metrics, so a router's operator, or a test, can tell that a
  // subscriber is connected before relying on the live stream: PUB drops what is sent before).
  zmq::socket_t pub{context, zmq::socket_type::xpub};
  std::optional<zmq::socket_t> replay;
  std::vector<Event> pending;  // scheduler thread only

  std::mutex mu;  // guards outbox, stop
  std::condition_variable wake;
  std::deque<std::string> outbox;  // encoded batches to send
  bool stop = false;
  std::thread thread;

  // The sending thread's own.
  int64_t next_seq = 0;
  std::deque<std::pair<int64_t, std::string>> sent;  // for replay

  void Run();
  void ServeReplay();
  void TakeSubscriptions();
};

void KvEventPublisher::Impl::Run() {
  for (;;) {
    std::deque<std::string> batches;
    bool stopping = false;
    {
      std::unique_lock<std::mutex> lock(mu);
      // The thread wakes every 20 ms to take subscriptions and answer the replay socket.
      wake.wait_for(lock, std::chrono::milliseconds(20), [&] { return stop || !outbox.empty(); });
      batches.swap(outbox);
      stopping = stop;
    }
    TakeSubscriptions();  // before sending: a subscriber that has arrived receives this batch
    for (std::string& payload : batches) {
      const int64_t seq = next_seq++;
      const std::string seq_bytes = SequenceBytes(seq);
      pub.send(zmq::buffer(options.topic), zmq::send_flags::sndmore);
      pub.send(zmq::buffer(seq_bytes), zmq::send_flags::sndmore);
      pub.send(zmq::buffer(payload), zmq::send_flags::none);
      metrics->kv_events_published++;
      if (replay) {
        sent.emplace_back(seq, std::move(payload));
        if (sent.size() > options.replay_batches) sent.pop_front();
      }
    }
    if (replay) ServeReplay();
    if (stopping) return;
  }
}

void KvEventPublisher::Impl::TakeSubscriptions() {
  for (;;) {
    zmq::message_t m;
    if (!pub.recv(m, zmq::recv_flags::dontwait)) return;
    // A subscription message is one byte, 1 (subscribe) or 0 (unsubscribe), then the topic prefix.
    if (m.size() >= 1 && static_cast<const uint8_t*>(m.data())[0] == 1) {
      metrics->kv_events_subscriptions++;
      Log(LogLevel::kInfo, fmt::format("kv events: a subscriber subscribed on {} (topic prefix \"{}\")",
                                       options.endpoint, std::string(static_cast<const char*>(m.data()) + 1,
                                                                     m.size() - 1)));
    }
  }
}

void KvEventPublisher::Impl::ServeReplay() {
  for (;;) {
    std::vector<zmq::message_t> frames;
    for (;;) {
      zmq::message_t frame;
      if (!replay->recv(frame, zmq::recv_flags::dontwait)) break;
      const bool more = frame.more();
      frames.push_back(std::move(frame));
      if (!more) break;
    }
    if (frames.empty()) return;
    // [client id, empty delimiter, first missed sequence number]; anything else is ignored.
    if (frames.size() != 3 || frames[2].size() != 8) continue;
    uint64_t start = 0;
    for (size_t i = 0; i < 8; ++i) start = (start << 8) | static_cast<const uint8_t*>(frames[2].data())[i];
    const std::string client(static_cast<const char*>(frames[0].data()), frames[0].size());
    for (const auto& [seq, payload] : sent) {
      if (seq < static_cast<int64_t>(start)) continue;
      replay->send(zmq::buffer(client), zmq::send_flags::sndmore);
      replay->send(zmq::message_t(), zmq::send_flags::sndmore);
      replay->send(zmq::buffer(SequenceBytes(seq)), zmq::send_flags::sndmore);
      replay->send(zmq::buffer(payload), zmq::send_flags::none);
    }
    replay->send(zmq::buffer(client), zmq::send_flags::sndmore);
    replay->send(zmq::message_t(), zmq::send_flags::sndmore);
    replay->send(zmq::buffer(SequenceBytes(-1)), zmq::send_flags::sndmore);
    replay->send(zmq::message_t(), zmq::send_flags::none);
  }
}

Result<std::unique_ptr<KvEventPublisher>> KvEventPublisher::Open(const KvEventsOptions& options, Metrics* metrics) {
  auto impl = std::make_unique<Impl>();
  impl->options = options;
  impl->metrics = metrics;
  // vLLM's rule: a wildcard address ("*", "::") or an ipc:// / inproc:// one is bound; any other is
  // connected to (llm-d's endpoint picker binds a SUB socket every replica connects to).
  const std::string& ep = options.endpoint;
  const bool bind = ep.find('*') != std::string::npos || ep.find("::") != std::string::npos ||
                    ep.rfind("ipc://", 0) == 0 || ep.rfind("inproc://", 0) == 0;
  try {
    impl->pub.set(zmq::sockopt::linger, 0);
    // Every subscription is passed up, a second subscriber's identical one too (each is counted).
    impl->pub.set(zmq::sockopt::xpub_verbose, 1);
    if (bind) {
      impl->pub.bind(ep);
    } else {
      impl->pub.connect(ep);
    }
  } catch (const zmq::error_t& e) {
    return Status::Error(fmt::format("--kv-events {}: cannot {} a ZeroMQ PUB socket ({}; expected e.g. "
                                     "tcp://*:5557 to bind, tcp://HOST:PORT to connect)",
                                     ep, bind ? "bind" : "connect", e.what()));
  }
  if (!options.replay_endpoint.empty()) {
    try {
      impl->replay.emplace(impl->context, zmq::socket_type::router);
      impl->replay->set(zmq::sockopt::linger, 0);
      impl->replay->bind(options.replay_endpoint);
    } catch (const zmq::error_t& e) {
      return Status::Error(fmt::format("--kv-events-replay {}: cannot bind a ZeroMQ ROUTER socket ({}; expected "
                                       "e.g. tcp://*:5558)", options.replay_endpoint, e.what()));
    }
  }
  Log(LogLevel::kInfo, fmt::format("kv events: publishing {} {}{}", bind ? "on" : "to", options.endpoint,
                                   options.replay_endpoint.empty() ? "" : ", replay on " + options.replay_endpoint));
  std::unique_ptr<KvEventPublisher> p(new KvEventPublisher(std::move(impl)));
  p->impl_->thread = std::thread([raw = p->impl_.get()] { raw->Run(); });
  return p;
}

KvEventPublisher::KvEventPublisher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}

KvEventPublisher::~KvEventPublisher() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->wake.notify_all();
  if (impl_->thread.joinable()) impl_->thread.join();
}

void KvEventPublisher::BlockStored(std::span<const uint64_t> hashes, std::optional<uint64_t> parent,
                                   std::span<const int32_t> token_ids, int32_t block_size, const std::string& medium) {
  if (hashes.empty()) return;
  impl_->pending.push_back({.kind = Event::kStored, .hashes = {hashes.begin(), hashes.end()}, .parent = parent,
                            .token_ids = {token_ids.begin(), token_ids.end()}, .block_size = block_size,
                            .medium = medium});
}

void KvEventPublisher::BlockRemoved(std::span<const uint64_t> hashes, const std::string& medium) {
  if (hashes.empty()) return;
  impl_->pending.push_back({.kind = Event::kRemoved, .hashes = {hashes.begin(), hashes.end()}, .medium = medium});
}

void KvEventPublisher::AllBlocksCleared() { impl_->pending.push_back({.kind = Event::kCleared}); }

void KvEventPublisher::Flush() {
  if (impl_->pending.empty()) return;
  std::string payload = Encode(impl_->pending);
  impl_->pending.clear();
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->outbox.push_back(std::move(payload));
  }
  impl_->wake.notify_all();
}

void KvBlockLedger::Sync(size_t holder, std::span<const int32_t> tokens, KvEventPublisher& out) {
  if (holders_.size() <= holder) holders_.resize(holder + 1);
  Held& held = holders_[holder];
  const size_t size = static_cast<size_t>(blocks_.block_size);
  const size_t full = tokens.size() / size * size;
  // The blocks it kept: those whose ids (and so all before them) are unchanged.
  const size_t same_ids = static_cast<size_t>(
      std::mismatch(held.ids.begin(), held.ids.begin() + static_cast<ptrdiff_t>(std::min(full, held.ids.size())),
                    tokens.begin()).first - held.ids.begin());
  const size_t kept = same_ids / size;
  if (kept == held.hashes.size() && full == held.ids.size()) return;  // nothing changed
  std::vector<uint64_t> hashes(held.hashes.begin(), held.hashes.begin() + static_cast<ptrdiff_t>(kept));
  uint64_t parent = kept == 0 ? KvRootHash(blocks_.hash_seed) : hashes.back();
  // New blocks first (another holder may drop the same ones below: no flapping), in runs of
  // blocks no holder had, each run announced with the block before it as its parent.
  size_t run_start = SIZE_MAX;
  auto close_run = [&](size_t end) {
    if (run_start == SIZE_MAX) return;
    out.BlockStored(std::span<const uint64_t>(hashes).subspan(run_start, end - run_start),
                    run_start == 0 ? std::nullopt : std::optional<uint64_t>(hashes[run_start - 1]),
                    tokens.subspan(run_start * size, (end - run_start) * size), blocks_.block_size, medium_);
    run_start = SIZE_MAX;
  };
  for (size_t b = kept; b < full / size; ++b) {
    parent = KvBlockHash(parent, tokens.subspan(b * size, size));
    hashes.push_back(parent);
    if (refs_[parent]++ == 0) {
      if (run_start == SIZE_MAX) run_start = b;
    } else {
      close_run(b);
    }
  }
  close_run(hashes.size());
  std::vector<uint64_t> removed;
  for (size_t b = kept; b < held.hashes.size(); ++b) {
    auto it = refs_.find(held.hashes[b]);
    if (it != refs_.end() && --it->second == 0) {
      removed.push_back(held.hashes[b]);
      refs_.erase(it);
    }
  }
  out.BlockRemoved(removed, medium_);
  held.ids.assign(tokens.begin(), tokens.begin() + static_cast<ptrdiff_t>(full));
  held.hashes = std::move(hashes);
}

void KvBlockLedger::Reset() {
  holders_.clear();
  refs_.clear();
}

}  // namespace kvq::server
