// kvq serve's engine, the parts that share its caches with other replicas (see engine.h): the
// shared prefix store (remote_prefix_store.h) and the KV events a router reads (kv_events.h).
#include <fmt/format.h>

#include <algorithm>
#include <map>

#include "kvq/log.h"
#include "server/engine.h"

namespace kvq::server {

Status Engine::OpenScaleOut() {
  if (!options_.prefix_store_url.empty() || !options_.kv_events.endpoint.empty()) {
    if (options_.kv_blocks.block_size < 1) {
      return Status::Error(fmt::format("--kv-block-size {}: expected a number of tokens ≥ 1",
                                       options_.kv_blocks.block_size));
    }
  }
  if (options_.kv_events.endpoint.empty() && !options_.kv_events.replay_endpoint.empty()) {
    return Status::Error("--kv-events-replay " + options_.kv_events.replay_endpoint +
                         ": replays what --kv-events publishes; give --kv-events tcp://*:PORT too");
  }
  if (!options_.prefix_store_url.empty()) {
    Result<std::unique_ptr<RemotePrefixStore>> shared = RemotePrefixStore::Open(
        options_.prefix_store_url, RemotePrefixNamespace(model_.fingerprint(), KvFolderName(options_.kv), options_.kv_blocks),
        options_.kv_blocks, metrics_);
    if (!shared.ok()) return shared.status();
    shared_store_ = std::move(shared).value();
  }
  if (!options_.kv_events.endpoint.empty()) {
    Result<std::unique_ptr<KvEventPublisher>> events = KvEventPublisher::Open(options_.kv_events, metrics_);
    if (!events.ok()) return events.status();
    events_ = std::move(events).value();
    ledger_.emplace(options_.kv_blocks, options_.kv.budgets.disk_dir.empty() ? "CPU" : "DISK");
  }
  return Status::Ok();
}

void Engine::SaveShared(Slot& slot) {
  const std::vector<uint64_t> stored = shared_store_->Save(*slot.session);
  if (events_ && !stored.empty()) {
    const size_t n = stored.size() * static_cast<size_t>(options_.kv_blocks.block_size);
    events_->BlockStored(stored, std::nullopt, slot.session->tokens().subspan(0, n), options_.kv_blocks.block_size,
                         "REMOTE");
  }
}

bool Engine::RestoreSharedPrefix(Session& session, const std::vector<int32_t>& prompt, bool fixed_state,
                                 size_t& reuse) {
  const std::optional<RemotePrefixStore::Match> match = shared_store_->Find(prompt);
  if (!match) return false;
  const size_t block = static_cast<size_t>(options_.kv_blocks.block_size);
  size_t shared = std::min(match->blocks * block, prompt.size() - 1);  // the last token runs again
  if (fixed_state) {
    // A recurrent state cannot be cut: the snapshot's every token must be the prompt's.
    if (match->blocks != match->snapshot_blocks || match->tokens > static_cast<int64_t>(prompt.size()) - 1) return false;
    shared = static_cast<size_t>(match->tokens);
  }
  if (shared < reuse + block) return false;  // the session's own prefix is as good, or nearly
  if (Status s = shared_store_->Load(*match, prompt, session); !s.ok()) {
    // A refused value cleared the session; an outage or an evicted value left it as it was.
    reuse = std::min(reuse, static_cast<size_t>(session.positions()));
    return false;
  }
  if (fixed_state && !std::equal(session.tokens().begin(), session.tokens().end(), prompt.begin())) {
    (void)session.Clear();
    reuse = 0;
    return false;
  }
  reuse = shared;
  Log(LogLevel::kInfo, fmt::format("prefix store: restored {} tokens ({} blocks) of a {}-token prompt", shared,
                                   match->blocks, prompt.size()));
  return true;
}

void Engine::ResetPrefixCache() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    reset_requested_ = true;
  }
  wake_.notify_all();
}

void Engine::ClearIdleSessions() {
  for (Slot& s : slots_) {
    if (s.job) continue;
    (void)s.session->Clear();
    s.from_disk = false;
  }
  if (events_) {
    events_->AllBlocksCleared();
    ledger_->Reset();  // PublishBlocks announces the running sessions' blocks again
    // The folder keeps its snapshots: announced again too.
    folder_ledger_.reset();
    folder_holders_.clear();
    free_folder_holders_.clear();
    folder_version_ = -1;
  }
}

void Engine::PublishBlocks() {
  if (!events_) return;
  for (size_t i = 0; i < slots_.size(); ++i) ledger_->Sync(i, slots_[i].session->tokens(), *events_);
  PublishFolderBlocks();
  events_->Flush();
}

void Engine::PublishFolderBlocks() {
  if (!prefix_store_ || prefix_store_->version() == folder_version_) return;
  folder_version_ = prefix_store_->version();
  if (!folder_ledger_) folder_ledger_.emplace(options_.kv_blocks, "DISK");
  std::map<std::string, const PrefixStore::Entry*> now;
  for (const PrefixStore::Entry* e : prefix_store_->Newest(prefix_store_->size())) now[e->snapshot] = e;
  for (auto it = folder_holders_.begin(); it != folder_holders_.end();) {  // gone: saved over, evicted, refused
    if (now.count(it->first)) {
      ++it;
      continue;
    }
    folder_ledger_->Sync(it->second, {}, *events_);
    free_folder_holders_.push_back(it->second);
    it = folder_holders_.erase(it);
  }
  for (const auto& [path, entry] : now) {
    if (folder_holders_.count(path)) continue;  // a snapshot file's ids never change
    size_t holder = folder_holders_.size() + free_folder_holders_.size();
    if (!free_folder_holders_.empty()) {
      holder = free_folder_holders_.back();
      free_folder_holders_.pop_back();
    }
    folder_holders_[path] = holder;
    folder_ledger_->Sync(holder, entry->ids, *events_);
  }
}

}  // namespace kvq::server
