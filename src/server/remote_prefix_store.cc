// kvq serve's shared prefix store in Redis (see remote_prefix_store.h).
#include "server/remote_prefix_store.h"

#include <fmt/format.h>
#include <hiredis/hiredis.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <system_error>

#include "kvq/log.h"

namespace kvq::server {
namespace {

namespace fs = std::filesystem;

// Each command waits this long at most: an unreachable Redis costs a request this, once, and
// then nothing until the next retry. Long enough that a loaded host's slow reply is not taken for
// an outage (which would drop the save).
constexpr timeval kTimeout{.tv_sec = 1, .tv_usec = 0};
constexpr auto kRetryEvery = std::chrono::seconds(1);

struct ReplyDeleter {
  void operator()(redisReply* r) const { freeReplyObject(r); }
};
using Reply = std::unique_ptr<redisReply, ReplyDeleter>;

Reply Command(redisContext* c, const std::vector<std::string>& args) {
  std::vector<const char*> argv;
  std::vector<size_t> lens;
  for (const std::string& a : args) {
    argv.push_back(a.data());
    lens.push_back(a.size());
  }
  return Reply(static_cast<redisReply*>(
      redisCommandArgv(c, static_cast<int>(argv.size()), argv.data(), lens.data())));
}

std::string ReadFile(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

}  // namespace

Result<RedisAddress> ParseRedisUrl(const std::string& url) {
  const std::string scheme = "redis://";
  const auto bad = [&](const std::string& why) {
    return Status::Error(fmt::format("--prefix-store {}: {} (expected redis://HOST:PORT[/DB])", url, why));
  };
  if (url.rfind(scheme, 0) != 0) return bad("not a redis:// URL");
  std::string rest = url.substr(scheme.size());
  RedisAddress a;
  if (const size_t slash = rest.find('/'); slash != std::string::npos) {
    const std::string db = rest.substr(slash + 1);
    char* end = nullptr;
    const long n = std::strtol(db.c_str(), &end, 10);
    if (db.empty() || *end != '\0' || n < 0 || n > 1 << 20) return bad("DB must be a number ≥ 0");
    a.db = static_cast<int>(n);
    rest = rest.substr(0, slash);
  }
  if (const size_t colon = rest.rfind(':'); colon != std::string::npos) {
    const std::string port = rest.substr(colon + 1);
    char* end = nullptr;
    const long n = std::strtol(port.c_str(), &end, 10);
    if (port.empty() || *end != '\0' || n < 1 || n > 65535) return bad("PORT must be in 1..65535");
    a.port = static_cast<int>(n);
    rest = rest.substr(0, colon);
  }
  if (rest.empty()) return bad("no HOST");
  a.host = rest;
  return a;
}

std::string RemotePrefixNamespace(const ModelFingerprint& model, const std::string& kv_name,
                                  const KvBlockOptions& blocks) {
  return fmt::format("kvq:m{:016x}-{}x{}x{}:{}:b{}:s{:x}", model.weights_hash, model.n_layers, model.n_kv_heads,
                     model.head_dim, kv_name, blocks.block_size, blocks.hash_seed);
}

Result<std::unique_ptr<RemotePrefixStore>> RemotePrefixStore::Open(const std::string& url, std::string ns,
                                                                   const KvBlockOptions& blocks, Metrics* metrics) {
  Result<RedisAddress> address = ParseRedisUrl(url);
  if (!address.ok()) return address.status();
  std::unique_ptr<RemotePrefixStore> s(new RemotePrefixStore);
  s->address_ = *address;
  s->url_ = url;
  s->ns_ = std::move(ns);
  s->blocks_ = blocks;
  s->metrics_ = metrics;
  std::error_code ec;
  const fs::path temp = fs::temp_directory_path(ec);
  if (ec) return Status::Error(fmt::format("--prefix-store: no temporary folder for snapshots in transit ({})", ec.message()));
  s->scratch_ = (temp / fmt::format("kvq-prefix-store-{}-{}-", getpid(), reinterpret_cast<uintptr_t>(s.get()))).string();
  if (s->Connect()) Log(LogLevel::kInfo, fmt::format("prefix store: {} (keys {}:*)", url, s->ns_));
  return s;
}

RemotePrefixStore::~RemotePrefixStore() {
  if (context_ != nullptr) redisFree(context_);
}

bool RemotePrefixStore::Connect() {
  if (context_ != nullptr) return true;
  const auto now = std::chrono::steady_clock::now();
  if (now < next_retry_) return false;
  next_retry_ = now + kRetryEvery;
  redisContext* c = redisConnectWithTimeout(address_.host.c_str(), address_.port, kTimeout);
  std::string why;
  if (c == nullptr) {
    why = "cannot allocate a connection";
  } else if (c->err != 0) {
    why = c->errstr;
  } else {
    redisSetTimeout(c, kTimeout);
    if (address_.db != 0) {
      Reply r = Command(c, {"SELECT", std::to_string(address_.db)});
      if (!r || r->type == REDIS_REPLY_ERROR) why = r ? std::string(r->str, r->len) : std::string(c->errstr);
    }
  }
  if (!why.empty()) {
    if (c != nullptr) redisFree(c);
    Down(why);
    return false;
  }
  context_ = c;
  metrics_->prefix_store_up = 1;
  if (logged_down_) Log(LogLevel::kInfo, fmt::format("prefix store: {} is back; sharing prefixes again", url_));
  logged_down_ = false;
  return true;
}

void RemotePrefixStore::Down(const std::string& why) {
  if (context_ != nullptr) {
    redisFree(context_);
    context_ = nullptr;
  }
  metrics_->prefix_store_up = 0;
  metrics_->prefix_store_errors++;
  if (!logged_down_) {
    Log(LogLevel::kWarning, fmt::format("prefix store: {} unreachable ({}); serving from local caches, retrying "
                                        "every second", url_, why));
    logged_down_ = true;
  }
}

std::string RemotePrefixStore::Key(const char* kind, uint64_t hash) const {
  return fmt::format("{}:{}:{:016x}", ns_, kind, hash);
}

std::optional<RemotePrefixStore::Match> RemotePrefixStore::Find(std::span<const int32_t> prompt) {
  const std::vector<uint64_t> hashes = KvBlockHashes(prompt, blocks_);
  if (hashes.empty() || !Connect()) return std::nullopt;
  std::vector<std::string> args{"MGET"};
  for (uint64_t h : hashes) args.push_back(Key("blk", h));
  Reply r = Command(context_, args);
  if (!r || r->type != REDIS_REPLY_ARRAY || r->elements != hashes.size()) {
    Down(r ? "unexpected reply to MGET" : context_->errstr);
    return std::nullopt;
  }
  for (size_t i = hashes.size(); i-- > 0;) {
    const redisReply* e = r->element[i];
    if (e->type != REDIS_REPLY_STRING) continue;
    std::istringstream value(std::string(e->str, e->len));
    Match m;
    std::string snapshot_hex;
    if (!(value >> snapshot_hex >> m.snapshot_blocks >> m.tokens) || m.snapshot_blocks < i + 1) continue;  // malformed
    m.snapshot = std::strtoull(snapshot_hex.c_str(), nullptr, 16);
    m.blocks = i + 1;
    return m;
  }
  return std::nullopt;
}

Status RemotePrefixStore::Load(const Match& match, std::span<const int32_t> prompt, Session& session) {
  if (!Connect()) return Status::Error("prefix store: down");
  const std::string key = Key("snap", match.snapshot);
  Reply r = Command(context_, {"GET", key});
  if (!r || (r->type != REDIS_REPLY_STRING && r->type != REDIS_REPLY_NIL)) {
    Down(r ? "unexpected reply to GET" : context_->errstr);
    return Status::Error("prefix store: down");
  }
  if (r->type == REDIS_REPLY_NIL) return Status::Error(fmt::format("prefix store: {} was evicted", key));
  metrics_->prefix_store_bytes_read_remote += static_cast<int64_t>(r->len);
  const std::string path = scratch_ + "load.kvqs";
  {
    std::ofstream out(path, std::ios::binary | std::ios::trunc);
    out.write(r->str, static_cast<std::streamsize>(r->len));
    if (!out.flush()) {
      std::error_code ec;
      fs::remove(path, ec);
      return Status::Error(fmt::format("prefix store: cannot write {}", path));
    }
  }
  r.reset();
  Result<int64_t> loaded = session.LoadPrefix(path);
  std::error_code ec;
  fs::remove(path, ec);
  const size_t shared = match.blocks * static_cast<size_t>(blocks_.block_size);
  Status error = Status::Ok();
  if (!loaded.ok()) {
    error = Status::Error(fmt::format("prefix store: {} refused: {}", key, loaded.status().message()));
  } else if (session.tokens().size() < shared ||
             !std::equal(prompt.begin(), prompt.begin() + static_cast<ptrdiff_t>(shared), session.tokens().begin())) {
    error = Status::Error(fmt::format("prefix store: {} holds other tokens than its block hashes name", key));
  }
  if (!error.ok()) {
    (void)session.Clear();
    metrics_->prefix_snapshots_refused++;
    Reply del = Command(context_, {"DEL", key});  // recomputed and saved again by the request
    Log(LogLevel::kWarning, error.message() + "; deleted");
  }
  return error;
}

std::vector<uint64_t> RemotePrefixStore::Save(const Session& session) {
  const std::span<const int32_t> ids = session.tokens();
  const std::vector<uint64_t> hashes = KvBlockHashes(ids, blocks_);
  if (hashes.empty() || !Connect()) return {};
  // Already held: the last block's index names a snapshot of as many blocks or more that exists.
  Reply have = Command(context_, {"GET", Key("blk", hashes.back())});
  if (!have) {
    Down(context_->errstr);
    return {};
  }
  if (have->type == REDIS_REPLY_STRING) {
    std::istringstream value(std::string(have->str, have->len));
    std::string snapshot_hex;
    size_t blocks = 0;
    if (value >> snapshot_hex >> blocks && blocks >= hashes.size()) {
      Reply exists = Command(context_, {"EXISTS", fmt::format("{}:snap:{}", ns_, snapshot_hex)});
      if (exists && exists->type == REDIS_REPLY_INTEGER && exists->integer == 1) return {};
    }
  }
  const std::string path = scratch_ + "save.kvqs";
  const Status saved = session.SavePrefix(path);
  const std::string bytes = saved.ok() ? ReadFile(path) : std::string();
  std::error_code ec;
  fs::remove(path, ec);
  if (!saved.ok()) {
    Log(LogLevel::kWarning, "prefix store: " + saved.message());
    return {};
  }
  // The snapshot first, then the index that names it: a reader never finds an index entry whose
  // snapshot is still to come (only one evicted since, which is a miss).
  std::vector<std::string> set{"SET", Key("snap", hashes.back()), bytes};
  Reply stored = Command(context_, set);
  if (!stored || stored->type == REDIS_REPLY_ERROR) {
    if (stored) {  // e.g. OOM with maxmemory-policy noeviction: the server is up, the value too big
      Log(LogLevel::kWarning, "prefix store: SET refused: " + std::string(stored->str, stored->len));
      metrics_->prefix_store_errors++;
    } else {
      Down(context_->errstr);
    }
    return {};
  }
  metrics_->prefix_store_bytes_written_remote += static_cast<int64_t>(bytes.size());
  std::vector<std::string> index{"MSET"};
  const std::string value =
      fmt::format("{:016x} {} {}", hashes.back(), hashes.size(), static_cast<int64_t>(ids.size()));
  for (uint64_t h : hashes) {
    index.push_back(Key("blk", h));
    index.push_back(value);
  }
  Reply indexed = Command(context_, index);
  if (!indexed || indexed->type == REDIS_REPLY_ERROR) {
    if (!indexed) Down(context_->errstr);
    return {};
  }
  metrics_->prefix_snapshots_saved_remote++;
  return hashes;
}

}  // namespace kvq::server
