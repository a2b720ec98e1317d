// Session::Prefill and Session::RunBatch (see include/kvq/session.h): the items checked, then run
// in blocks of kPrefillBlock tokens per item through DecoderModel::ForwardBatch, with the abort
// callbacks asked between blocks.
#include <fmt/format.h>

#include <algorithm>
#include <optional>

#include "api/api_internal.h"

namespace kvq {

Status Session::Prefill(std::span<const int32_t> ids) {
  if (ids.empty()) return Status::Ok();
  const BatchItem one{.session = this, .tokens = ids};
  return RunItems(std::span<const BatchItem>(&one, 1), "Prefill", Abortable::kYes);
}

Status Session::Prefill(std::span<const int32_t> ids, std::span<const int32_t> logits_at) {
  if (ids.empty() && logits_at.empty()) return Status::Ok();
  const BatchItem one{.session = this, .tokens = ids, .logits_at = logits_at};
  return RunItems(std::span<const BatchItem>(&one, 1), "Prefill", Abortable::kYes);
}

Status Session::RunBatch(std::span<const BatchItem> items) {
  return RunItems(items, "RunBatch", Abortable::kYes);
}

void Session::SetAbortCallback(std::function<bool()> should_abort) {
  impl_->should_abort = std::move(should_abort);
}

Status Session::RunItems(std::span<const BatchItem> items, std::string_view caller,
                         Abortable abortable) {
  const bool batch = caller == "RunBatch";
  // "Prefill: " or "RunBatch: item 3: ", before what is wrong with the item.
  auto where = [&](size_t i) {
    return batch ? fmt::format("{}: item {}: ", caller, i) : fmt::format("{}: ", caller);
  };
  if (items.empty()) return Status::Error(fmt::format("{}: no items", caller));
  for (size_t i = 0; i < items.size(); ++i) {
    const BatchItem& item = items[i];
    if (item.session == nullptr) return Status::Error(where(i) + "the session is null");
    if (item.tokens.empty()) {
      return Status::Error(where(i) + "no tokens (an item runs at least one)");
    }
    for (size_t j = 0; j < i; ++j) {
      if (items[j].session == item.session) {
        return Status::Error(fmt::format("{}: items {} and {} are the same session", caller, j, i));
      }
    }
    const Impl& s = *item.session->impl_;
    if (s.model.get() != items[0].session->impl_->model.get()) {
      return Status::Error(where(i) + "the session belongs to another model than item 0's");
    }
    const int32_t vocab = s.model->info.vocab_size;
    for (size_t t = 0; t < item.tokens.size(); ++t) {
      if (item.tokens[t] < 0 || item.tokens[t] >= vocab) {
        return Status::Error(where(i) +
                             fmt::format("token {} at index {} is outside the vocabulary [0, {})",
                                         item.tokens[t], t, vocab));
      }
    }
    for (size_t j = 0; j < item.logits_at.size(); ++j) {
      const int32_t at = item.logits_at[j];
      if (at < 0 || static_cast<size_t>(at) >= item.tokens.size()) {
        return Status::Error(where(i) +
                             fmt::format("logits_at[{}] is {}; expected an index into the {} "
                                         "tokens, [0, {})",
                                         j, at, item.tokens.size(), item.tokens.size()));
      }
      if (j > 0 && at <= item.logits_at[j - 1]) {
        return Status::Error(where(i) +
                             fmt::format("logits_at[{}] is {}, not after logits_at[{}] = {} "
                                         "(the indices increase)",
                                         j, at, j - 1, item.logits_at[j - 1]));
      }
    }
    const int64_t held = item.session->positions();
    if (held + static_cast<int64_t>(item.tokens.size()) > item.session->context()) {
      return Status::Error(
          where(i) + fmt::format("the session holds {} positions and its context is {}; {} more "
                                 "tokens do not fit",
                                 held, item.session->context(), item.tokens.size()));
    }
  }
  for (const BatchItem& item : items) {
    Impl& s = *item.session->impl_;
    s.aborted = false;
    s.chosen_logits.resize(item.logits_at.size() * static_cast<size_t>(s.model->info.vocab_size));
  }
  // Prefill runs on its session's own forward pass, RunBatch on one lent by the model (with the
  // first item's thread count); each segment attends over its own cache.
  std::optional<Model::Impl::LentPass> lent;
  if (batch) lent.emplace(items[0].session->impl_->model->LendBatchPass(items[0].session->threads()));
  DecoderModel& llama = batch ? (*lent)->llama : items[0].session->impl_->llama;
  std::vector<ForwardSegment>& segments = batch ? (*lent)->segments : items[0].session->impl_->segments;
  constexpr size_t kBlock = kPrefillBlock;
  for (size_t done = 0;; done += kBlock) {  // pass p runs block p of every item that has one
    // Between blocks, never inside one: what ran stays a whole number of blocks in every cache.
    if (done > 0 && abortable == Abortable::kYes) {
      if (Status st = CheckAbort(items, done, caller); !st.ok()) return st;
    }
    segments.clear();
    for (const BatchItem& item : items) {
      if (item.tokens.size() <= done) continue;
      Impl& s = *item.session->impl_;
      const int32_t n = static_cast<int32_t>(std::min<size_t>(kBlock, item.tokens.size() - done));
      const bool last = done + n == item.tokens.size();  // only the last block's logits are kept
      const int64_t vocab = s.model->info.vocab_size;
      if (last) s.logits.resize(vocab);
      // logits_at within this block, as rows of the block: [first, first + rows) of logits_at.
      const auto first = std::lower_bound(item.logits_at.begin(), item.logits_at.end(),
                                          static_cast<int32_t>(done));
      const auto end =
          std::lower_bound(first, item.logits_at.end(), static_cast<int32_t>(done + n));
      s.block_rows.clear();
      for (auto at = first; at != end; ++at)
        s.block_rows.push_back(*at - static_cast<int32_t>(done));
      segments.push_back(
          {.tokens = item.tokens.data() + done,
           .n = n,
           .pos = static_cast<int64_t>(s.tokens.size()),
           .cache = *s.cache,
           .logits = last ? s.logits.data() : nullptr,
           .logit_rows = s.block_rows.data(),
           .n_logit_rows = static_cast<int32_t>(s.block_rows.size()),
           .row_logits = s.chosen_logits.data() + (first - item.logits_at.begin()) * vocab});
    }
    if (segments.empty()) return Status::Ok();
    if (Status st = llama.ForwardBatch(segments); !st.ok()) {
      // Some layers may hold part of a block: start over rather than guess what the caches hold.
      for (const BatchItem& item : items) (void)item.session->Clear();
      return Status::Error(st.message() + (batch ? " (every session of the batch was cleared)"
                                                 : " (the session was cleared)"));
    }
    for (const BatchItem& item : items) {
      if (item.tokens.size() <= done) continue;
      const auto first = item.tokens.begin() + static_cast<std::ptrdiff_t>(done);
      const size_t n = std::min<size_t>(kBlock, item.tokens.size() - done);
      Impl& s = *item.session->impl_;
      s.tokens.insert(s.tokens.end(), first, first + n);
      s.positions_run += static_cast<int64_t>(n);
      if (s.after_block) s.after_block(static_cast<int64_t>(s.tokens.size()));
    }
  }
}

Model::Impl::LentPass Model::Impl::LendBatchPass(int32_t threads) const {
  std::unique_ptr<BatchPass> pass;
  {
    std::lock_guard<std::mutex> lock(batch_passes_mutex_);
    if (!free_batch_passes_.empty()) {
      pass = std::move(free_batch_passes_.back());
      free_batch_passes_.pop_back();
    } else {
      ++batch_passes_made_;
    }
  }
  if (pass == nullptr) pass.reset(new BatchPass{.llama = DecoderModel(weights, threads), .segments = {}});
  pass->llama.set_threads(threads);
  return LentPass(*this, std::move(pass));
}

void Model::Impl::ReturnBatchPass(std::unique_ptr<BatchPass> pass) const {
  std::lock_guard<std::mutex> lock(batch_passes_mutex_);
  free_batch_passes_.push_back(std::move(pass));
}

size_t Model::Impl::batch_passes_made() const {
  std::lock_guard<std::mutex> lock(batch_passes_mutex_);
  return batch_passes_made_;
}

Status Session::CheckAbort(std::span<const BatchItem> items, size_t done, std::string_view caller) {
  // Every session with a block left is asked (each callback once), so a batch stops when any of
  // its sessions is cancelled: the others resume with their next call.
  size_t fired = items.size();
  for (size_t i = 0; i < items.size(); ++i) {
    const Impl& s = *items[i].session->impl_;
    if (items[i].tokens.size() > done && s.should_abort && s.should_abort() &&
        fired == items.size())
      fired = i;
  }
  if (fired == items.size()) return Status::Ok();
  std::string held;  // "64, 10, 128"
  for (const BatchItem& item : items) {
    Impl& s = *item.session->impl_;
    s.aborted = true;
    // The last block with logits did not run: those of an earlier call would mislead.
    if (item.tokens.size() > done) s.logits.clear();
    s.chosen_logits.clear();
    held += fmt::format("{}{}", held.empty() ? "" : ", ", s.tokens.size());
  }
  if (caller != "RunBatch") {
    return Status::Error(fmt::format(
        "{}: aborted by the abort callback after {} of {} tokens; the session holds {} positions",
        caller, done, items[0].tokens.size(), held));
  }
  return Status::Error(fmt::format(
      "RunBatch: aborted by item {}'s abort callback after {} tokens per item; the sessions hold "
      "{} positions (in item order)",
      fired, done, held));
}

}  // namespace kvq
