// Draft-model speculation's parts outside Session::Generate (see include/kvq/speculation.h): the
// vocabulary check, and keeping the draft session in step with the target's tokens while it
// drafts greedily.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "api/api_internal.h"

namespace kvq {

Status CheckDraftVocabulary(const Model& target, const Model& draft) {
  return CheckDraftVocabulary(target.impl(), draft.impl());
}

Status CheckDraftVocabulary(const Model::Impl& target, const Model::Impl& draft) {
  const Tokenizer& t = target.tokenizer;
  const Tokenizer& d = draft.tokenizer;
  const std::string& tp = target.info.path;
  const std::string& dp = draft.info.path;
  const int32_t common = std::min(t.vocab_size(), d.vocab_size());
  for (int32_t id = 0; id < common; ++id) {
    if (t.piece(id) != d.piece(id) || t.type(id) != d.type(id)) {
      return Status::Error(fmt::format(
          "the draft model {} does not share the vocabulary of {}: token {} is \"{}\" (type {}) there and \"{}\" "
          "(type {}) here",
          dp, tp, id, d.piece(id), static_cast<int>(d.type(id)), t.piece(id), static_cast<int>(t.type(id))));
    }
  }
  if (t.vocab_size() != d.vocab_size()) {
    return Status::Error(fmt::format(
        "the draft model {} does not share the vocabulary of {}: it has {} tokens and {} has {} (the first id "
        "one of them lacks is {})",
        dp, tp, d.vocab_size(), tp, t.vocab_size(), common));
  }
  return Status::Ok();
}

Status PrepareDraftSession(const SpeculationOptions& spec, Session::Impl& s) {
  const Model& draft = *spec.draft_model;
  const KvOptions& kv = spec.draft_kv;
  // While s.draft lives it keeps its model alive, so no other model can be at that address.
  if (s.draft != nullptr && s.draft_model == &draft.impl() && s.draft_kv_key == kv.key_format &&
      s.draft_kv_value == kv.value_format && s.draft_kv_context == kv.context && kv.layers.empty()) {
    return Status::Ok();  // the draft session of an earlier call, still in step with its tokens
  }
  s.draft.reset();
  s.draft_model = nullptr;
  if (Status st = CheckDraftVocabulary(*s.model, draft.impl()); !st.ok()) return st;
  Result<std::unique_ptr<Session>> session = draft.NewSession(kv);
  if (!session.ok()) {
    return Status::Error(fmt::format("the draft model {}: {}", draft.info().path, session.status().message()));
  }
  s.draft = std::move(session).value();
  s.draft_model = &draft.impl();
  s.draft_kv_key = kv.key_format;
  s.draft_kv_value = kv.value_format;
  s.draft_kv_context = kv.context;
  return Status::Ok();
}

namespace {

// SyncDraft's first half: the draft keeps the longest prefix of `sequence` it holds (its tokens
// after it are a rejected draft's; at least the last token runs again, for the logits after it)
// and the rest of `sequence`, to run, is returned. Empty when the draft is in step already.
Result<std::span<const int32_t>> CatchUp(Session& draft, std::span<const int32_t> sequence) {
  const int64_t run = DraftCatchUpTokens(draft, sequence);
  if (run == 0) return std::span<const int32_t>();
  const int64_t keep = static_cast<int64_t>(sequence.size()) - run;
  if (draft.positions() > keep) {
    if (Status st = draft.Truncate(keep); !st.ok()) return st;
  }
  return sequence.subspan(static_cast<size_t>(draft.positions()));
}

}  // namespace

int64_t DraftCatchUpTokens(const Session& draft, std::span<const int32_t> sequence) {
  const int64_t size = static_cast<int64_t>(sequence.size());
  if (size == 0) return 0;
  const std::span<const int32_t> held = draft.tokens();
  const int64_t same = std::mismatch(held.begin(), held.end(), sequence.begin(), sequence.end()).first - held.begin();
  if (same == size && draft.positions() == size && !draft.logits().empty()) return 0;
  return size - std::min(same, size - 1);  // what follows the prefix it keeps
}

Status SyncDraft(Session& draft, std::span<const int32_t> sequence) {
  const int64_t size = static_cast<int64_t>(sequence.size());
  if (size == 0 || size > draft.context()) return Status::Ok();  // nothing to draft after
  Result<std::span<const int32_t>> rest = CatchUp(draft, sequence);
  if (!rest.ok()) return rest.status();
  return rest->empty() ? Status::Ok() : draft.Prefill(*rest);
}

Status Session::PrefillDraft(const SpeculationOptions& speculation) {
  if (speculation.source != DraftSource::kModel) {
    return Status::Error("PrefillDraft: speculation.source must be DraftSource::kModel (a draft model's session)");
  }
  if (Status st = CheckSpeculation(speculation); !st.ok()) return Status::Error("PrefillDraft: " + st.message());
  Impl& s = *impl_;
  if (Status st = PrepareDraftSession(speculation, s); !st.ok()) return Status::Error("PrefillDraft: " + st.message());
  if (Status st = SyncDraft(*s.draft, s.tokens); !st.ok()) {
    s.draft.reset();  // a draft session that failed halfway is not kept: the next Generate starts a new one
    s.draft_model = nullptr;
    return Status::Error("PrefillDraft: the draft model: " + st.message());
  }
  return Status::Ok();
}

Result<int32_t> DraftByModels(std::span<ModelDraft> drafts, double* catch_up_seconds) {
  int32_t passes = 0;
  if (catch_up_seconds != nullptr) *catch_up_seconds = 0;
  std::vector<int32_t> limit(drafts.size(), 0);  // [drafts] tokens each may draft at most
  std::vector<size_t> active, next;              // drafts still drafting (indices into drafts)
  std::vector<BatchItem> items;                  // [≤ drafts] one pass's sessions and tokens
  for (size_t i = 0; i < drafts.size(); ++i) {
    ModelDraft& d = drafts[i];
    d.tokens.clear();
    d.caught_up = 0;
    const int64_t size = static_cast<int64_t>(d.sequence.size());
    // Every drafted token but the last runs through the draft: they must fit its context.
    limit[i] = static_cast<int32_t>(std::min<int64_t>(d.max_tokens, d.draft->context() - size + 1));
    if (limit[i] <= 0 || size == 0) continue;
    Result<std::span<const int32_t>> rest = CatchUp(*d.draft, d.sequence);
    if (!rest.ok()) return rest.status();
    if (!rest->empty()) items.push_back({.session = d.draft, .tokens = *rest});
    d.caught_up = static_cast<int64_t>(rest->size());
    active.push_back(i);
  }
  // Each pass runs every session that needs it together: the draft's weights read once per pass.
  auto run = [&]() -> Status {
    if (items.empty()) return Status::Ok();
    ++passes;
    return Session::RunBatch(items);
  };
  const auto start = std::chrono::steady_clock::now();
  if (Status st = run(); !st.ok()) return st;
  if (catch_up_seconds != nullptr && !items.empty()) {
    *catch_up_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
  // A hybrid draft's recurrent state before the tokens it drafts: the next call drops a rejected
  // draft back to it (Session::Truncate) instead of running the whole sequence again.
  for (const size_t i : active) {
    Session& draft = *drafts[i].draft;
    if (draft.checkpoint_positions() != draft.positions()) draft.SaveCheckpoint();
  }
  while (!active.empty()) {
    next.clear();
    for (const size_t i : active) {
      ModelDraft& d = drafts[i];
      // Greedy: the most likely token (the smaller id on a tie) and its probability,
      // 1 / Σ exp(logit − max).
      const std::span<const float> logits = d.draft->logits();
      const int32_t best = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      double sum = 0;
      for (const float l : logits) sum += std::exp(static_cast<double>(l) - logits[best]);
      if (1.0 / sum < d.min_probability) continue;
      d.tokens.push_back(best);
      if (static_cast<int32_t>(d.tokens.size()) < limit[i]) next.push_back(i);
    }
    items.clear();  // after every push_back above: the spans point into the drafts' tokens
    for (const size_t i : next) items.push_back({.session = drafts[i].draft, .tokens = std::span(drafts[i].tokens).last(1)});
    if (Status st = run(); !st.ok()) return st;
    active.swap(next);
  }
  return passes;
}

Result<std::vector<int32_t>> DraftByModel(Session& draft, std::span<const int32_t> sequence, int32_t max_tokens,
                                          double min_probability) {
  ModelDraft one{.draft = &draft, .sequence = sequence, .max_tokens = max_tokens, .min_probability = min_probability,
                 .tokens = {}};
  if (Result<int32_t> passes = DraftByModels(std::span(&one, 1)); !passes.ok()) return passes.status();
  return std::move(one.tokens);
}

}  // namespace kvq
