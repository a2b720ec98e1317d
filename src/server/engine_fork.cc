// The engine's live prefix reuse: a request sharing a prompt prefix with another session (idle or
// running) forks that session's cache instead of prefilling the prefix again, and a request that
// arrives while another is still prefilling the same system prompt waits for it and then forks.
#include <algorithm>

#include "kvq/log.h"
#include "server/engine.h"

namespace kvq::server {

Engine::Donor Engine::FindDonor(const Slot& slot, const std::vector<int32_t>& prompt, bool fixed_state) {
  if (!options_.kv.budgets.disk_dir.empty()) return {};  // Session::Fork refuses a disk master
  const size_t most = prompt.size() - 1;  // the prompt's last token always runs, for its logits
  Donor donor{.slot = nullptr, .shared = std::min(CommonPrefix(slot.session->tokens(), prompt), most)};
  for (Slot& s : slots_) {
    if (&s == &slot) continue;
    const size_t shared = std::min(CommonPrefix(s.session->tokens(), prompt), most);
    if (shared <= donor.shared) continue;
    if (fixed_state && static_cast<size_t>(s.session->positions()) > shared) continue;
    donor = {.slot = &s, .shared = shared};
  }
  return donor.slot != nullptr ? donor : Donor{};
}

bool Engine::ForkFrom(Slot& slot, const Slot& donor, size_t shared) {
  Result<std::unique_ptr<Session>> forked = donor.session->Fork();
  Status cut = forked.ok() ? Status::Ok() : forked.status();
  if (cut.ok() && static_cast<size_t>((*forked)->positions()) > shared) {
    cut = (*forked)->Truncate(static_cast<int64_t>(shared));
  }
  if (!cut.ok()) {
    Log(LogLevel::kWarning, "serve: forking a live session's prefix failed (" + cut.message() + "); prefilling it");
    return false;
  }
  slot.session = std::move(forked).value();
  RecordBorrow(slot, &donor, shared);
  return true;
}

void Engine::RecordBorrow(Slot& slot, const Slot* donor, size_t tokens) {
  for (Slot& s : slots_) {
    if (s.borrowed_from == &slot) s.borrowed_from = nullptr;  // its donor's session is gone
  }
  slot.borrowed_from = donor;
  slot.borrowed_tokens = tokens;
  slot.borrowed_bytes = donor != nullptr ? KvBytesFor(static_cast<int64_t>(tokens)) - model_.info().state_bytes : 0;
}

bool Engine::BorrowStillHeld(const Slot& slot) const {
  if (slot.borrowed_from == nullptr) return false;
  const std::span<const int32_t> mine = slot.session->tokens();
  return mine.size() >= slot.borrowed_tokens &&
         CommonPrefix(slot.borrowed_from->session->tokens(), mine.first(slot.borrowed_tokens)) == slot.borrowed_tokens;
}

int64_t Engine::SlotReservedBytes(const Slot& slot) const {
  const int64_t whole = slot.job ? slot.job->kv_reserved_bytes : SessionBytes(*slot.session) + DraftBytes(slot);
  return BorrowStillHeld(slot) ? std::max<int64_t>(0, whole - slot.borrowed_bytes) : whole;
}

bool Engine::WaitsForRunningPrefix(const std::vector<int32_t>& prompt, size_t have, bool fixed_state) const {
  // A hybrid's donor must not have run past the shared tokens, which a prefill chunk may do before
  // the waiting job is looked at again; a disk master cannot fork.
  if (fixed_state || !options_.kv.budgets.disk_dir.empty()) return false;
  const size_t most = prompt.size() - 1;
  for (const Slot& s : slots_) {
    if (!s.job || s.pending.empty()) continue;  // not prefilling
    // What its cache will hold once its prompt has run: the session's tokens, then the pending ones.
    const std::span<const int32_t> held = s.session->tokens();
    size_t shared = std::min(CommonPrefix(held, prompt), most);
    if (shared == held.size()) {
      shared += CommonPrefix(s.pending, std::span<const int32_t>(prompt).subspan(std::min(held.size(), prompt.size())));
      shared = std::min(shared, most);
    }
    if (shared >= have + kPrefillBlock && static_cast<size_t>(s.session->positions()) < shared) return true;
  }
  return false;
}

}  // namespace kvq::server
