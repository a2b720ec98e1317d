// kvq serve --kv-events: a ZeroMQ subscriber, written here from the wire format alone (msgpack
// arrays, vLLM's KVEventBatch), follows a replica: every BlockStored's hashes are recomputed from
// its token ids with this file's own FNV-1a chain (the definition in server/kv_blocks.h, with the
// block size and seed given as flags), the prompt's blocks are announced, a second prompt that
// takes the only session evicts them (BlockRemoved), POST /reset_prefix_cache sends
// AllBlocksCleared, and the batches published before the subscriber connected come back from the
// replay socket, in order and identical to what a subscriber would have seen. Both ways round:
// the replica binds, or it connects to a subscriber that binds. And the --prefix-cache folder's
// snapshots arrive as DISK blocks, stored when saved and removed when the folder's limit evicts them.
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <msgpack.hpp>
#include <nlohmann/json.hpp>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <thread>
#include <vector>
#include <zmq.hpp>

#include "test_util/serve_processes.h"

namespace kvq::test {
namespace {

using json = nlohmann::json;
constexpr int kBlock = 8;
constexpr uint64_t kSeed = 7;

uint64_t Fnv(uint64_t h, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) {
    h ^= (v >> (8 * i)) & 0xff;
    h *= 1099511628211ull;
  }
  return h;
}
uint64_t Root() { return Fnv(14695981039346656037ull, kSeed, 8); }
uint64_t Chain(uint64_t parent, const std::vector<int64_t>& ids, size_t from) {
  uint64_t h = Fnv(14695981039346656037ull, parent, 8);
  for (size_t i = from; i < from + kBlock; ++i) h = Fnv(h, static_cast<uint32_t>(ids[i]), 4);
  return h;
}

struct Event {
  std::string tag;
  std::vector<uint64_t> hashes;
  std::optional<uint64_t> parent;
  std::vector<int64_t> tokens;
  int64_t block_size = 0;
  std::string medium;
};

// One KVEventBatch payload: [ts, [event...]], each event an array with its tag first.
std::vector<Event> Decode(const std::string& payload) {
  msgpack::object_handle h = msgpack::unpack(payload.data(), payload.size());
  const msgpack::object& batch = h.get();
  EXPECT_EQ(batch.type, msgpack::type::ARRAY);
  EXPECT_EQ(batch.via.array.size, 2u);
  EXPECT_EQ(batch.via.array.ptr[0].type, msgpack::type::FLOAT64);  // ts
  EXPECT_GT(batch.via.array.ptr[0].as<double>(), 1.7e9);            // seconds since the epoch
  std::vector<Event> out;
  const msgpack::object& events = batch.via.array.ptr[1];
  for (uint32_t i = 0; i < events.via.array.size; ++i) {
    const msgpack::object_array& e = events.via.array.ptr[i].via.array;
    Event ev{.tag = e.ptr[0].as<std::string>()};
    if (ev.tag == "BlockStored") {
      EXPECT_EQ(e.size, 7u);
      ev.hashes = e.ptr[1].as<std::vector<uint64_t>>();
      if (e.ptr[2].type != msgpack::type::NIL) ev.parent = e.ptr[2].as<uint64_t>();
      ev.tokens = e.ptr[3].as<std::vector<int64_t>>();
      ev.block_size = e.ptr[4].as<int64_t>();
      EXPECT_EQ(e.ptr[5].type, msgpack::type::NIL);  // lora_id
      ev.medium = e.ptr[6].as<std::string>();
    } else if (ev.tag == "BlockRemoved") {
      EXPECT_EQ(e.size, 3u);
      ev.hashes = e.ptr[1].as<std::vector<uint64_t>>();
      ev.medium = e.ptr[2].as<std::string>();
    } else {
      EXPECT_EQ(ev.tag, "AllBlocksCleared");
      EXPECT_EQ(e.size, 1u);
    }
    out.push_back(std::move(ev));
  }
  return out;
}

int64_t Seq(const zmq::message_t& m) {
  EXPECT_EQ(m.size(), 8u);
  uint64_t v = 0;
  for (size_t i = 0; i < 8; ++i) v = (v << 8) | static_cast<const uint8_t*>(m.data())[i];
  return static_cast<int64_t>(v);
}

std::vector<int32_t> Tokenize(int port, const std::string& text) {
  httplib::Client c("127.0.0.1", port);
  httplib::Result r = c.Post("/tokenize", json{{"content", text}, {"add_special", true}}.dump(), "application/json");
  EXPECT_TRUE(r && r->status == 200);
  return r ? json::parse(r->body)["tokens"].get<std::vector<int32_t>>() : std::vector<int32_t>{};
}

void Complete(int port, const std::string& prompt) {
  httplib::Client c("127.0.0.1", port);
  c.set_read_timeout(std::chrono::seconds(60));
  httplib::Result r = c.Post("/v1/completions",
                             json{{"prompt", prompt}, {"max_tokens", 4}, {"temperature", 0}}.dump(), "application/json");
  ASSERT_TRUE(r && r->status == 200);
}

// The hashes of every full block of `ids` by this file's own chain.
std::vector<uint64_t> Hashes(const std::vector<int32_t>& ids) {
  std::vector<int64_t> wide(ids.begin(), ids.end());
  std::vector<uint64_t> out;
  uint64_t parent = Root();
  for (size_t s = 0; s + kBlock <= wide.size(); s += kBlock) out.push_back(parent = Chain(parent, wide, s));
  return out;
}

// A counter of the server's /metrics (`name`, unlabelled), or -1 when it cannot be read.
int64_t Counter(int port, const std::string& name) {
  httplib::Result r = httplib::Client("127.0.0.1", port).Get("/metrics");
  std::smatch m;
  const std::regex line("\n" + name + " (\\d+)\n");
  if (!r || !std::regex_search(r->body, m, line)) return -1;
  return std::stoll(m[1]);
}

// One batch from `sub` within its receive timeout: {seq, events}, or nullopt when none came (or
// its frames were not the three of a KVEventBatch message, a failure recorded).
std::optional<std::pair<int64_t, std::vector<Event>>> ReceiveBatch(zmq::socket_t& sub) {
  std::vector<zmq::message_t> frames;
  zmq::message_t m;
  if (!sub.recv(m)) return std::nullopt;
  frames.push_back(std::move(m));
  while (frames.back().more()) {
    zmq::message_t part;
    EXPECT_TRUE(sub.recv(part));
    frames.push_back(std::move(part));
  }
  EXPECT_EQ(frames.size(), 3u);
  if (frames.size() != 3u) return std::nullopt;
  EXPECT_EQ(frames[0].size(), 0u);  // the topic: empty by default
  return std::make_pair(Seq(frames[1]), Decode(frames[2].to_string()));
}

// The subscriptions the server has taken (kvq_kv_event_subscriptions_total).
int64_t Subscriptions(int port) { return Counter(port, "kvq_kv_event_subscriptions_total"); }

// `publish_to`: --kv-events; the subscriber binds `sub_address` when `sub_binds` (the server then
// connects to it, as a replica does to llm-d's endpoint picker), else connects to it (the server
// binds). Either way the test goes on once the server has counted the subscription: a batch sent
// before that is dropped by ZeroMQ, by design. A binding SUB sends its subscription to a peer that
// connected only when its own thread next enters libzmq (the new connection's pipe is attached by
// a command the socket processes in its owner's calls), so the wait keeps receiving; a test that
// slept instead, with the socket idle, published its events before the subscription left.
void FollowAReplica(const std::string& publish_to, const std::string& sub_address, bool sub_binds) {
  const int replay_port = FreePort();
  const std::string gguf = std::string(KVQ_SOURCE_DIR) + "/models/stories260K/stories260K.gguf";
  Replica server({"-m", gguf, "--parallel", "1", "--kv-block-size", std::to_string(kBlock), "--kv-hash-seed",
                  std::to_string(kSeed), "--kv-events", publish_to,
                  "--kv-events-replay", "tcp://127.0.0.1:" + std::to_string(replay_port)});
  ASSERT_GT(server.port, 0) << server.log;
  const std::string first = "Once upon a time, there was a little girl named Lily. She liked to play in the park.";
  const std::string second = "The big red dog ran to the sun and saw a happy bird in the tall green tree.";
  const std::vector<int32_t> first_ids = Tokenize(server.port, first), second_ids = Tokenize(server.port, second);
  ASSERT_GE(first_ids.size(), 3u * kBlock);
  // Published before the subscription reaches the server (PUB drops what no one subscribed to):
  // only the replay has it. The prompt's blocks go out (seq 0) when its prefill step ends, long
  // before the response; the engine's step after the last token and the publisher's own thread
  // may still send a batch after the response, so the test waits for seq 0 to have been sent and
  // takes any later batch that reaches the subscriber as live (a race, not a fault: seen in CI).
  Complete(server.port, first);
  const auto sent_by = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (Counter(server.port, "kvq_kv_event_batches_total") < 1) {
    ASSERT_LT(std::chrono::steady_clock::now(), sent_by) << "the first prompt's blocks were not sent in 20 s\n"
                                                          << server.log;
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  }

  zmq::context_t context;
  zmq::socket_t sub(context, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "");
  sub.set(zmq::sockopt::rcvtimeo, 200);
  if (sub_binds) {
    sub.bind(sub_address);  // the server's PUB has been retrying its connect since it started
  } else {
    sub.connect(sub_address);
  }
  std::vector<std::pair<int64_t, std::vector<Event>>> live;  // (seq, events) as received
  // Receives one batch into `live` within the socket's 200 ms timeout; false when none came.
  auto receive_one = [&]() -> bool {
    std::optional<std::pair<int64_t, std::vector<Event>>> batch = ReceiveBatch(sub);
    if (batch) live.push_back(std::move(*batch));
    return batch.has_value();
  };
  const auto subscribed_by = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (Subscriptions(server.port) < 1) {
    ASSERT_LT(std::chrono::steady_clock::now(), subscribed_by) << "no subscription reached the server in 20 s\n"
                                                                << server.log;
    receive_one();  // 200 ms: the socket takes commands; a batch that comes is the first prompt's
  }

  auto receive_until = [&](auto&& done) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (std::chrono::steady_clock::now() < until) {
      if (receive_one() && done(live.back().second)) return;
    }
    httplib::Result metrics = httplib::Client("127.0.0.1", server.port).Get("/metrics");
    ADD_FAILURE() << "no such event within 20 s (" << live.size() << " batches received; sub " << sub_address << ")\n"
                  << server.log << (metrics ? metrics->body : "");
  };
  auto has = [](const std::vector<Event>& events, const std::string& tag) {
    return std::any_of(events.begin(), events.end(), [&](const Event& e) { return e.tag == tag; });
  };
  Complete(server.port, second);  // takes the only session: the first prompt's blocks go
  receive_until([&](const std::vector<Event>& e) { return has(e, "BlockRemoved"); });
  httplib::Client(("127.0.0.1"), server.port).Post("/reset_prefix_cache", "", "application/json");
  receive_until([&](const std::vector<Event>& e) { return has(e, "AllBlocksCleared"); });
  ASSERT_FALSE(live.empty());
  ASSERT_GT(live.front().first, 0);  // the first prompt's batches came before we subscribed

  // The replay: everything from 0, in order, ending with seq -1 and an empty payload.
  zmq::socket_t replay(context, zmq::socket_type::dealer);
  replay.set(zmq::sockopt::rcvtimeo, 5000);
  replay.connect("tcp://127.0.0.1:" + std::to_string(replay_port));
  replay.send(zmq::message_t(), zmq::send_flags::sndmore);  // REQ's empty delimiter
  replay.send(zmq::buffer(std::string(8, '\0')), zmq::send_flags::none);  // from seq 0
  std::vector<std::pair<int64_t, std::string>> replayed;
  for (;;) {
    std::vector<zmq::message_t> frames;
    do {
      zmq::message_t part;
      ASSERT_TRUE(replay.recv(part)) << "the replay socket did not answer within 5 s";
      frames.push_back(std::move(part));
    } while (frames.back().more());
    ASSERT_EQ(frames.size(), 3u);  // delimiter, seq, payload
    if (Seq(frames[1]) == -1) {
      EXPECT_EQ(frames[2].size(), 0u);
      break;
    }
    replayed.emplace_back(Seq(frames[1]), frames[2].to_string());
  }
  ASSERT_GE(replayed.size(), static_cast<size_t>(live.back().first + 1));
  for (size_t i = 0; i < replayed.size(); ++i) EXPECT_EQ(replayed[i].first, static_cast<int64_t>(i));

  // Every event, from the replay (which holds what the live socket saw too): hashes recomputed.
  std::set<uint64_t> stored, removed;
  bool cleared = false;
  for (const auto& [seq, payload] : replayed) {
    for (const Event& e : Decode(payload)) {
      if (e.tag == "BlockStored") {
        EXPECT_EQ(e.block_size, kBlock);
        EXPECT_EQ(e.medium, "CPU");
        ASSERT_EQ(e.tokens.size(), e.hashes.size() * kBlock);
        uint64_t parent = e.parent.value_or(Root());
        for (size_t b = 0; b < e.hashes.size(); ++b) {
          parent = Chain(parent, e.tokens, b * kBlock);
          EXPECT_EQ(e.hashes[b], parent) << "seq " << seq << " block " << b;
        }
        if (!cleared) stored.insert(e.hashes.begin(), e.hashes.end());
      } else if (e.tag == "BlockRemoved") {
        EXPECT_EQ(e.medium, "CPU");
        removed.insert(e.hashes.begin(), e.hashes.end());
      } else {
        cleared = true;
      }
    }
  }
  EXPECT_TRUE(cleared);
  const std::vector<uint64_t> first_hashes = Hashes(first_ids), second_hashes = Hashes(second_ids);
  const std::set<uint64_t> second_set(second_hashes.begin(), second_hashes.end());
  for (uint64_t h : first_hashes) {
    EXPECT_TRUE(stored.count(h)) << "a block of the first prompt was never announced";
    if (!second_set.count(h)) {
      EXPECT_TRUE(removed.count(h)) << "a block of the first prompt was never removed";
    }
  }
  for (uint64_t h : second_hashes) EXPECT_TRUE(stored.count(h)) << "a block of the second prompt was never announced";
}

TEST(KvEvents, ASubscriberFollowsAReplicaThatBinds) {
  const std::string socket = (std::filesystem::path(::testing::TempDir()) / ("kvq_events_" + std::to_string(getpid()))).string();
  FollowAReplica("ipc://" + socket, "ipc://" + socket, /*sub_binds=*/false);
  std::filesystem::remove(socket);  // the server bound it and was killed: ZeroMQ did not remove it
}

TEST(KvEvents, AReplicaConnectsToASubscriberThatBinds) {
  const std::string address = "tcp://127.0.0.1:" + std::to_string(FreePort());
  FollowAReplica(address, address, /*sub_binds=*/true);
}

// The snapshot files (.kvqs) under `dir`, by size.
std::vector<int64_t> SnapshotSizes(const std::filesystem::path& dir) {
  std::vector<int64_t> sizes;
  std::error_code ec;
  for (const auto& f : std::filesystem::recursive_directory_iterator(dir, ec)) {
    if (f.path().extension() == ".kvqs") sizes.push_back(static_cast<int64_t>(f.file_size()));
  }
  return sizes;
}

// The --prefix-cache folder's snapshots are announced with medium DISK: BlockStored when one is
// saved, BlockRemoved when the folder's byte limit evicts it (blocks another snapshot still holds
// stay). The limit is set from a first server's two snapshot sizes so that the second evicts the
// first.
TEST(KvEvents, TheFolderAnnouncesItsSnapshotsAsDisk) {
  const std::string gguf = std::string(KVQ_SOURCE_DIR) + "/models/stories260K/stories260K.gguf";
  const std::filesystem::path base = std::filesystem::path(::testing::TempDir()) /
                                     ("kvq_events_disk_" + std::to_string(getpid()));
  std::filesystem::remove_all(base);
  // Both longer than the 32 positions below which no snapshot is saved; no block in common.
  const std::string first = "Once upon a time, there was a little girl named Lily. She liked to play in the park "
                            "with her big red ball and her small brown dog every sunny day.";
  const std::string second = "The big red dog ran to the sun and saw a happy bird in the tall green tree. Then "
                             "the bird sang a song and the dog barked at the moon all night long.";
  auto wait_for_snapshots = [](const std::filesystem::path& dir, size_t n) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (SnapshotSizes(dir).size() < n && std::chrono::steady_clock::now() < until) {
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    return SnapshotSizes(dir);
  };
  int64_t limit = 0;
  {
    Replica measure({"-m", gguf, "--parallel", "1", "--prefix-cache", (base / "measure").string()});
    ASSERT_GT(measure.port, 0) << measure.log;
    Complete(measure.port, first);
    Complete(measure.port, second);
    const std::vector<int64_t> sizes = wait_for_snapshots(base / "measure", 2);
    ASSERT_EQ(sizes.size(), 2u) << measure.log;
    limit = sizes[0] + sizes[1] - 1;  // one fits, both do not
  }
  const std::string address = "ipc://" + (base.parent_path() / ("kvq_events_disk_" + std::to_string(getpid()) +
                                                                ".sock")).string();
  Replica server({"-m", gguf, "--parallel", "1", "--kv-block-size", std::to_string(kBlock), "--kv-hash-seed",
                  std::to_string(kSeed), "--kv-events", address, "--prefix-cache", (base / "events").string(),
                  "--prefix-cache-size", std::to_string(limit)});
  ASSERT_GT(server.port, 0) << server.log;
  zmq::context_t context;
  zmq::socket_t sub(context, zmq::socket_type::sub);
  sub.set(zmq::sockopt::subscribe, "");
  sub.set(zmq::sockopt::rcvtimeo, 200);
  sub.connect(address);
  const auto subscribed_by = std::chrono::steady_clock::now() + std::chrono::seconds(20);
  while (Subscriptions(server.port) < 1) {
    ASSERT_LT(std::chrono::steady_clock::now(), subscribed_by) << "no subscription in 20 s\n" << server.log;
    zmq::message_t m;
    ASSERT_FALSE(sub.recv(m)) << "a batch arrived with nothing published";
  }
  std::set<uint64_t> stored, removed;  // DISK only
  // Receives until `done()` holds, gathering DISK events (and checking each BlockStored's chain).
  auto receive_until = [&](auto&& done) {
    const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(20);
    while (!done()) {
      ASSERT_LT(std::chrono::steady_clock::now(), until) << "no such DISK event within 20 s\n" << server.log;
      const std::optional<std::pair<int64_t, std::vector<Event>>> batch = ReceiveBatch(sub);
      if (!batch) continue;
      for (const Event& e : batch->second) {
        if (e.medium != "DISK") continue;
        if (e.tag == "BlockStored") {
          ASSERT_EQ(e.tokens.size(), e.hashes.size() * kBlock);
          uint64_t parent = e.parent.value_or(Root());
          for (size_t b = 0; b < e.hashes.size(); ++b) {
            parent = Chain(parent, e.tokens, b * kBlock);
            EXPECT_EQ(e.hashes[b], parent) << "block " << b;
          }
          stored.insert(e.hashes.begin(), e.hashes.end());
        } else if (e.tag == "BlockRemoved") {
          removed.insert(e.hashes.begin(), e.hashes.end());
        }
      }
    }
  };
  auto all_in = [](const std::vector<uint64_t>& hashes, const std::set<uint64_t>& set) {
    return std::all_of(hashes.begin(), hashes.end(), [&](uint64_t h) { return set.count(h) > 0; });
  };
  const std::vector<uint64_t> first_hashes = Hashes(Tokenize(server.port, first));
  const std::vector<uint64_t> second_hashes = Hashes(Tokenize(server.port, second));
  ASSERT_GE(first_hashes.size(), 4u);
  Complete(server.port, first);
  receive_until([&] { return all_in(first_hashes, stored); });
  EXPECT_TRUE(removed.empty());
  Complete(server.port, second);  // saved; the folder's limit then evicts the first's snapshot
  receive_until([&] { return all_in(second_hashes, stored) && all_in(first_hashes, removed); });
  for (uint64_t h : second_hashes) EXPECT_FALSE(removed.count(h)) << "a block of the kept snapshot was removed";
  const std::vector<int64_t> left = SnapshotSizes(base / "events");
  ASSERT_EQ(left.size(), 1u);
  // The folder's tier in /metrics, updated in the step that sent the events: bytes and use.
  httplib::Result metrics = httplib::Client("127.0.0.1", server.port).Get("/metrics");
  ASSERT_TRUE(metrics && metrics->status == 200);
  std::smatch m;
  ASSERT_TRUE(std::regex_search(metrics->body, m, std::regex("\nkvq_kv_bytes\\{tier=\"folder\"\\} (\\d+)\n")))
      << metrics->body;
  EXPECT_EQ(std::stoll(m[1]), left[0]);
  const std::regex usage("\nkvq_kv_usage_perc\\{tier=\"folder\"\\} ([0-9.e-]+)\n");
  ASSERT_TRUE(std::regex_search(metrics->body, m, usage)) << metrics->body;
  // fmt prints the shortest text that reads back as the same double: the quotient compares exactly.
  EXPECT_EQ(std::stod(m[1]), static_cast<double>(left[0]) / static_cast<double>(limit));
  std::filesystem::remove_all(base);
  std::filesystem::remove(address.substr(std::string("ipc://").size()));  // the server's socket (it is killed, not closed)
}

}  // namespace
}  // namespace kvq::test
