// kvq serve's prefix snapshots on disk (see prefix_store.h).
#include "server/prefix_store.h"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <system_error>

#include "kvq/log.h"

namespace kvq::server {
namespace {

namespace fs = std::filesystem;

constexpr const char* kIdsMagic = "kvq-prefix-ids";
constexpr int kIdsVersion = 1;

uint64_t HashIds(std::span<const int32_t> ids) {  // FNV-1a over the ids' bytes
  uint64_t h = 1469598103934665603ull;
  for (int32_t id : ids) {
    for (int b = 0; b < 4; ++b) {
      h ^= (static_cast<uint32_t>(id) >> (8 * b)) & 0xff;
      h *= 1099511628211ull;
    }
  }
  return h;
}

// Reads a sidecar; nullopt when it is not one (then it and its snapshot are deleted).
std::optional<std::vector<int32_t>> ReadIds(const fs::path& path) {
  std::ifstream in(path);
  std::string magic;
  int version = 0;
  int64_t count = -1;
  if (!(in >> magic >> version >> count) || magic != kIdsMagic || version != kIdsVersion || count <= 0 ||
      count > (int64_t{1} << 26)) {
    return std::nullopt;
  }
  std::vector<int32_t> ids;
  ids.reserve(static_cast<size_t>(std::min<int64_t>(count, 1 << 20)));
  for (int64_t i = 0; i < count; ++i) {
    int64_t id = 0;
    if (!(in >> id) || id < 0 || id > INT32_MAX) return std::nullopt;
    ids.push_back(static_cast<int32_t>(id));
  }
  std::string extra;
  if (in >> extra) return std::nullopt;
  return ids;
}

}  // namespace

size_t CommonPrefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  const size_t n = std::min(a.size(), b.size());
  return static_cast<size_t>(std::mismatch(a.begin(), a.begin() + n, b.begin()).first - a.begin());
}

std::string KvFolderName(const KvOptions& kv) {
  if (!kv.layers.empty()) {
    std::string specs;
    for (const KvLayerSpec& l : kv.layers) specs += l.key + "/" + l.value + ";";
    uint64_t h = 1469598103934665603ull;
    for (unsigned char c : specs) h = (h ^ c) * 1099511628211ull;
    return fmt::format("plan-{:016x}", h);
  }
  std::string name = kv.key_format == kv.value_format ? kv.key_format : kv.key_format + "_" + kv.value_format;
  for (char& c : name) {
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '-' && c != '_') c = '-';
  }
  return name;
}

Result<std::unique_ptr<PrefixStore>> PrefixStore::Open(const std::string& dir, const std::string& kv_name,
                                                       int64_t max_bytes) {
  std::unique_ptr<PrefixStore> store(new PrefixStore);
  store->folder_ = (fs::path(dir) / kv_name).string();
  store->max_bytes_ = max_bytes;
  std::error_code ec;
  fs::create_directories(store->folder_, ec);
  if (ec || !fs::is_directory(store->folder_)) {
    return Status::Error(fmt::format("--prefix-cache {}: cannot create the folder {} ({})", dir, store->folder_,
                                     ec ? ec.message() : "not a directory"));
  }
  std::vector<std::pair<fs::file_time_type, Entry>> found;
  for (const fs::directory_entry& f : fs::directory_iterator(store->folder_, ec)) {
    const fs::path p = f.path();
    if (p.extension() == ".tmp" || p.filename().string().find(".tmp") != std::string::npos) {
      fs::remove(p, ec);  // a write that did not finish
      continue;
    }
    if (p.extension() != ".ids") continue;
    const fs::path snapshot = fs::path(p).replace_extension(".kvqs");
    std::optional<std::vector<int32_t>> ids = ReadIds(p);
    if (!ids || !fs::is_regular_file(snapshot)) {
      Log(LogLevel::kWarning, fmt::format("prefix cache: {} is malformed or has no snapshot; deleted", p.string()));
      fs::remove(p, ec);
      fs::remove(snapshot, ec);
      ++store->refused_;
      continue;
    }
    Entry e{.snapshot = snapshot.string(), .ids = std::move(*ids),
            .bytes = static_cast<int64_t>(fs::file_size(snapshot, ec)), .sequence = 0};
    found.emplace_back(fs::last_write_time(snapshot, ec), std::move(e));
  }
  // Snapshots without a sidecar are orphans of an interrupted save.
  for (const fs::directory_entry& f : fs::directory_iterator(store->folder_, ec)) {
    if (f.path().extension() == ".kvqs" && !fs::exists(fs::path(f.path()).replace_extension(".ids"))) {
      fs::remove(f.path(), ec);
    }
  }
  std::sort(found.begin(), found.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto& [time, e] : found) {
    e.sequence = store->next_sequence_++;
    store->entries_.push_back(std::move(e));
  }
  store->Evict();
  return store;
}

std::optional<std::pair<const PrefixStore::Entry*, size_t>> PrefixStore::Find(std::span<const int32_t> prompt) const {
  const Entry* best = nullptr;
  size_t best_len = 0;
  for (const Entry& e : entries_) {
    const size_t n = CommonPrefix(e.ids, prompt);
    if (n > best_len) {
      best = &e;
      best_len = n;
    }
  }
  if (best == nullptr) return std::nullopt;
  return std::make_pair(best, best_len);
}

const PrefixStore::Entry* PrefixStore::Find(const std::string& snapshot) const {
  for (const Entry& e : entries_) {
    if (e.snapshot == snapshot) return &e;
  }
  return nullptr;
}

std::vector<const PrefixStore::Entry*> PrefixStore::Newest(size_t n) const {
  std::vector<const Entry*> all;
  for (const Entry& e : entries_) all.push_back(&e);
  std::sort(all.begin(), all.end(), [](const Entry* a, const Entry* b) { return a->sequence > b->sequence; });
  if (all.size() > n) all.resize(n);
  return all;
}

Status PrefixStore::Load(const Entry& entry, Session& session) {
  const std::string snapshot = entry.snapshot;  // entry goes away with Remove
  const std::vector<int32_t> ids = entry.ids;
  Result<int64_t> loaded = session.LoadPrefix(snapshot);
  Status error = Status::Ok();
  if (!loaded.ok()) {
    error = Status::Error(fmt::format("prefix cache: {} refused: {}", snapshot, loaded.status().message()));
  } else if (!std::equal(ids.begin(), ids.end(), session.tokens().begin(), session.tokens().end())) {
    error = Status::Error(fmt::format("prefix cache: {} holds other tokens than its sidecar says", snapshot));
  }
  if (!error.ok()) {
    (void)session.Clear();
    Remove(snapshot);
    ++refused_;
    Log(LogLevel::kWarning, error.message() + "; deleted");
  }
  return error;
}

Result<bool> PrefixStore::Save(const Session& session) {
  const std::span<const int32_t> ids = session.tokens();
  if (ids.empty()) return false;
  for (const Entry& e : entries_) {
    if (e.ids.size() >= ids.size() && CommonPrefix(e.ids, ids) == ids.size()) return false;  // covered
  }
  const std::string stem = (fs::path(folder_) / fmt::format("prefix-{:016x}", HashIds(ids))).string();
  if (Status s = session.SavePrefix(stem + ".kvqs"); !s.ok()) return s;
  {
    std::ofstream out(stem + ".ids.tmp", std::ios::trunc);
    out << kIdsMagic << ' ' << kIdsVersion << ' ' << ids.size() << '\n';
    for (int32_t id : ids) out << id << ' ';
    out << '\n';
    if (!out.flush()) {
      std::error_code ec;
      fs::remove(stem + ".kvqs", ec);
      return Status::Error(fmt::format("prefix cache: cannot write {}.ids", stem));
    }
  }
  std::error_code ec;
  fs::rename(stem + ".ids.tmp", stem + ".ids", ec);
  if (ec) return Status::Error(fmt::format("prefix cache: cannot rename {}.ids.tmp ({})", stem, ec.message()));
  // Entries that the new one extends are redundant: it holds their tokens and more.
  for (size_t i = 0; i < entries_.size();) {
    if (entries_[i].snapshot != stem + ".kvqs" && CommonPrefix(entries_[i].ids, ids) == entries_[i].ids.size()) {
      Remove(entries_[i].snapshot);
    } else {
      ++i;
    }
  }
  std::erase_if(entries_, [&](const Entry& e) { return e.snapshot == stem + ".kvqs"; });
  entries_.push_back({.snapshot = stem + ".kvqs", .ids = {ids.begin(), ids.end()},
                      .bytes = static_cast<int64_t>(fs::file_size(stem + ".kvqs", ec)), .sequence = next_sequence_++});
  ++version_;
  Evict();
  return true;
}

void PrefixStore::Remove(const std::string& snapshot) {
  std::error_code ec;
  fs::remove(snapshot, ec);
  fs::remove(fs::path(snapshot).replace_extension(".ids"), ec);
  std::erase_if(entries_, [&](const Entry& e) { return e.snapshot == snapshot; });
  ++version_;
}

int64_t PrefixStore::bytes() const {
  int64_t total = 0;
  for (const Entry& e : entries_) total += e.bytes;
  return total;
}

void PrefixStore::Evict() {
  int64_t total = bytes();
  while (total > max_bytes_ && !entries_.empty()) {
    auto oldest = std::min_element(entries_.begin(), entries_.end(),
                                   [](const Entry& a, const Entry& b) { return a.sequence < b.sequence; });
    total -= oldest->bytes;
    Remove(oldest->snapshot);
  }
}

}  // namespace kvq::server
