// The engine's block ledger (server/kv_events.h) through a real publisher on an ipc:// socket:
// a block is announced when its first holder gets it and removed when its last holder drops it,
// a run of new blocks names the block before it as parent; and --prefix-store's URL parser.
#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <msgpack.hpp>
#include <numeric>
#include <thread>
#include <zmq.hpp>

#include "server/kv_events.h"
#include "server/remote_prefix_store.h"

namespace kvq::server {
namespace {

struct Seen {
  std::string tag;
  std::vector<uint64_t> hashes;
  std::optional<uint64_t> parent;
  size_t tokens = 0;
};

class LedgerTest : public ::testing::Test {
 protected:
  void SetUp() override {
    address_ = "ipc://" + (std::filesystem::path(::testing::TempDir()) /
                           ("kvq_ledger_" + std::to_string(getpid()))).string();
    Result<std::unique_ptr<KvEventPublisher>> p = KvEventPublisher::Open({.endpoint = address_}, &metrics_);
    ASSERT_TRUE(p.ok()) << p.status().message();
    publisher_ = std::move(p).value();
    sub_.set(zmq::sockopt::subscribe, "");
    sub_.set(zmq::sockopt::rcvtimeo, 5000);
    sub_.connect(address_);
    // A probe batch until one arrives: the subscription has reached the publisher.
    sub_.set(zmq::sockopt::rcvtimeo, 50);
    for (int i = 0; i < 100 && Next().empty(); ++i) {
      publisher_->AllBlocksCleared();
      publisher_->Flush();
    }
    while (!Next().empty()) {}  // probes still in flight
    sub_.set(zmq::sockopt::rcvtimeo, 5000);
  }
  void TearDown() override {
    publisher_.reset();
    std::error_code ec;  // the socket's file, where ZeroMQ left it
    std::filesystem::remove(address_.substr(std::string("ipc://").size()), ec);
  }
  // The next batch's events (empty on timeout).
  std::vector<Seen> Next() {
    std::vector<zmq::message_t> frames;
    do {
      zmq::message_t m;
      if (!sub_.recv(m)) return {};
      frames.push_back(std::move(m));
    } while (frames.back().more());
    msgpack::object_handle h = msgpack::unpack(static_cast<const char*>(frames[2].data()), frames[2].size());
    std::vector<Seen> out;
    const msgpack::object& events = h.get().via.array.ptr[1];
    for (uint32_t i = 0; i < events.via.array.size; ++i) {
      const msgpack::object_array& e = events.via.array.ptr[i].via.array;
      Seen s{.tag = e.ptr[0].as<std::string>()};
      if (e.size > 1) s.hashes = e.ptr[1].as<std::vector<uint64_t>>();
      if (s.tag == "BlockStored") {
        if (e.ptr[2].type != msgpack::type::NIL) s.parent = e.ptr[2].as<uint64_t>();
        s.tokens = e.ptr[3].via.array.size;
      }
      out.push_back(std::move(s));
    }
    return out;
  }
  Metrics metrics_;
  std::string address_;
  std::unique_ptr<KvEventPublisher> publisher_;
  zmq::context_t context_;
  zmq::socket_t sub_{context_, zmq::socket_type::sub};
};

std::vector<int32_t> Ids(size_t n, int32_t first = 1) {
  std::vector<int32_t> v(n);
  std::iota(v.begin(), v.end(), first);
  return v;
}

TEST_F(LedgerTest, AnnouncesFirstHoldersAndRemovesLastOnes) {
  const KvBlockOptions o{.block_size = 4, .hash_seed = 3};
  KvBlockLedger ledger(o, "CPU");
  const std::vector<int32_t> a = Ids(14);  // 3 full blocks and 2 ids
  const std::vector<uint64_t> ha = KvBlockHashes(a, o);
  ledger.Sync(0, a, *publisher_);
  publisher_->Flush();
  std::vector<Seen> e = Next();
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].tag, "BlockStored");
  EXPECT_EQ(e[0].hashes, ha);
  EXPECT_FALSE(e[0].parent.has_value());
  EXPECT_EQ(e[0].tokens, 12u);

  // A second holder sharing the first 2 blocks: only its own third block is new, parent block 1.
  std::vector<int32_t> b = a;
  b[9] = 999;
  ledger.Sync(1, b, *publisher_);
  publisher_->Flush();
  e = Next();
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].tag, "BlockStored");
  EXPECT_EQ(e[0].hashes, std::vector<uint64_t>{KvBlockHashes(b, o)[2]});
  EXPECT_EQ(e[0].parent, ha[1]);

  // Holder 0 drops everything: only its third block goes (holder 1 still has blocks 0 and 1).
  ledger.Sync(0, {}, *publisher_);
  publisher_->Flush();
  e = Next();
  ASSERT_EQ(e.size(), 1u);
  EXPECT_EQ(e[0].tag, "BlockRemoved");
  EXPECT_EQ(e[0].hashes, std::vector<uint64_t>{ha[2]});

  // Nothing changed: no batch at all.
  ledger.Sync(1, b, *publisher_);
  publisher_->Flush();
  sub_.set(zmq::sockopt::rcvtimeo, 200);
  EXPECT_TRUE(Next().empty());
}

TEST(RedisUrl, ParsesAndRefusesNamingTheFlag) {
  Result<RedisAddress> a = ParseRedisUrl("redis://10.0.0.5:6380/2");
  ASSERT_TRUE(a.ok());
  EXPECT_EQ(a->host, "10.0.0.5");
  EXPECT_EQ(a->port, 6380);
  EXPECT_EQ(a->db, 2);
  Result<RedisAddress> b = ParseRedisUrl("redis://cache");
  ASSERT_TRUE(b.ok());
  EXPECT_EQ(b->port, 6379);
  EXPECT_EQ(b->db, 0);
  for (const char* bad : {"http://x:1", "redis://", "redis://h:0", "redis://h:70000", "redis://h:1/x", "redis://h:p"}) {
    Result<RedisAddress> r = ParseRedisUrl(bad);
    ASSERT_FALSE(r.ok()) << bad;
    EXPECT_NE(r.status().message().find("--prefix-store"), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find("redis://HOST:PORT[/DB]"), std::string::npos);
  }
}

}  // namespace
}  // namespace kvq::server
