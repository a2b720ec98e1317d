// Speculative decoding in the engine (see server/engine.h, JobSpec::speculation): a decoding
// session's segment of the batched step is its sampled token and a draft of what follows
// (kvq/speculation.h's drafters and gate: prompt lookup, the suffix tree, or a draft model whose
// session each slot keeps), and the draft is judged by JudgeDraft (kvq/speculation.h), as
// Session::Generate judges it — each position's token drawn by the request's sampler from that
// position's logits, with the penalties over the tokens before that position, in order, kept
// while it equals the drafted one — so a request's output is the same with or without
// speculation, alone or among others. Drawing a token and handing it to the request's Generator
// (Draw, Take) are here too: plain decoding (Engine::Advance) shares them.

#include <fmt/format.h>

#include <algorithm>
#include <chrono>

#include "kvq/log.h"
#include "server/engine.h"

namespace kvq::server {

namespace {
ApiError ServerError(std::string message) {
  return {.status = 500, .type = "server_error", .message = std::move(message), .param = "", .code = ""};
}
}  // namespace

SpeculationOptions SpeculationOf(const GenerationRequest& request, const SpeculationOptions& server_default) {
  SpeculationOptions o = server_default;
  if (request.spec) o.source = *request.spec;
  if (request.spec_n_max) {
    if (*request.spec_n_max == 0) {
      o.source = DraftSource::kNone;
    } else {
      o.max_draft = *request.spec_n_max;
      if (o.source == DraftSource::kNone && !request.spec) o.source = DraftSource::kNgram;
    }
  }
  if (request.spec_p_min) o.min_draft_probability = *request.spec_p_min;
  return o;
}

Status Engine::CheckSpeculationSetup() {
  const SpeculationOptions& o = options_.speculation;
  if (Status st = slots_[0].session->CheckDropsDrafts(); !st.ok()) speculation_refusal_ = st.message();
  if (options_.spec_index_tokens < 0) {
    return Status::Error(fmt::format("--spec-index-tokens must be ≥ 0 (got {})", options_.spec_index_tokens));
  }
  if (options_.spec_index_tokens > 0) {
    suffix_index_ = std::make_unique<SuffixIndex>(std::max<int64_t>(2, options_.spec_index_tokens),
                                                  o.max_ngram + o.max_draft);
  }
  if (o.draft_model != nullptr) {
    // Requests drafting with it reserve its session's bytes (DraftKvBytesFor): its formats and
    // context, from a session made now, so a draft KV spec it cannot have is refused at start.
    Result<std::unique_ptr<Session>> probe = o.draft_model->NewSession(o.draft_kv);
    if (!probe.ok()) return Status::Error("the draft model's KV cache (--draft-kv): " + probe.status().message());
    draft_context_ = (*probe)->context();
    Result<std::vector<LayerFormats>> formats = FormatsOf(o.draft_kv);
    if (!formats.ok()) return Status::Error("the draft model's KV cache (--draft-kv): " + formats.status().message());
    draft_layer_formats_ = std::move(formats).value();
  }
  if (o.source == DraftSource::kNone) return Status::Ok();
  if (Status st = CheckSpeculation(o); !st.ok()) return st;
  if (!speculation_refusal_.empty()) {
    return Status::Error(fmt::format("--spec {}: {}", DraftSourceName(o.source), speculation_refusal_));
  }
  if (o.draft_model != nullptr) return CheckDraftVocabulary(model_, *o.draft_model);
  return Status::Ok();
}

Result<int32_t> Engine::Draw(Slot& slot, std::span<const float> logits, int64_t unrun) {
  Job& job = *slot.job;
  if (!job.generator->has_grammar()) return slot.session->Sample(logits, unrun);
  job.constrained.assign(logits.begin(), logits.end());
  job.generator->Constrain(job.constrained);
  return slot.session->Sample(job.constrained, unrun);
}

GeneratorStep Engine::Take(Slot& slot, int32_t token, std::span<const float> logits, int32_t previous) {
  Job& job = *slot.job;
  // Logprobs are the model's (the logits before grammar, bias and penalties), read before the
  // token runs; each token's text is as it follows the one before, and as the output spells it
  // (Generator::TokenText: a preserved control token such as "[TOOL_CALLS]" has its text).
  std::optional<LogprobEntry> logprob;
  if (job.spec.top_logprobs >= 0) {
    const TokenLogprobs lp = LogprobsOf(logits, token, job.spec.top_logprobs);
    const Generator& g = *job.generator;
    logprob = LogprobEntry{
        .token = g.TokenText(previous, token), .logprob = lp.chosen.logprob, .top = {}};
    for (const TokenLogprob& t : lp.top) {
      logprob->top.emplace_back(g.TokenText(previous, t.id), t.logprob);
    }
  }
  const GeneratorStep step = job.generator->Next(token);
  if (step.kept) metrics_->generated_tokens++;
  if (!step.kept) logprob.reset();
  if (!step.text.empty() || logprob) job.Publish(step.text, false, FinishReason::kStop, {}, std::move(logprob));
  return step;
}

bool Engine::PrepareDraft(Slot& slot) {
  slot.pass.assign(1, slot.next_token);
  slot.rows.clear();
  Job& job = *slot.job;
  job.gated = false;
  const SpeculationOptions& o = job.spec.speculation;
  if (o.source == DraftSource::kNone) return false;
  Session& session = *slot.session;
  // A draft fits what the generator can still keep and the context can still hold.
  const int64_t room = std::min<int64_t>(session.context() - session.positions() - 1,
                                         job.spec.max_tokens - static_cast<int64_t>(job.generator->tokens().size()));
  const int32_t most = static_cast<int32_t>(std::clamp<int64_t>(room, 0, o.max_draft));
  if (!job.drafter) {  // the slot's gate from its last request, when shaped alike
    const bool resume = slot.gate.has_value() && slot.gate_key == SpeculationGateKey(o);
    job.drafter.emplace(o, resume ? &*slot.gate : nullptr);
    if (resume) metrics_->spec_gates_resumed++;
  }
  const std::span<const int32_t> held = session.tokens();
  job.history.assign(held.begin(), held.end());
  job.history.push_back(slot.next_token);
  if (o.source == DraftSource::kModel) {
    if (!slot.draft) {
      Result<std::unique_ptr<Session>> made = o.draft_model->NewSession(o.draft_kv);
      if (!made.ok()) {  // no draft: the request decodes a token per step, as it would without
        Log(LogLevel::kWarning, "serve: the draft model's session: " + made.status().message());
        job.spec.speculation.source = DraftSource::kNone;
        return false;
      }
      slot.draft = std::move(made).value();
    }
    // A model's draft costs a pass of the draft per token, and first a run of the tokens the draft
    // session missed while the gate drafted nothing: the gate chooses the length first.
    job.model_draft_want =
        job.drafter->ModelDraftLength(most, &job.gated, DraftCatchUpTokens(*slot.draft, job.history));
    return true;  // DraftWithModel drafts it with the other slots' drafts
  }
  Drafter::ExtraDrafter shared;  // the index over recent requests, for suffix drafts
  if (o.source == DraftSource::kSuffix && suffix_index_) {
    shared = [&](std::span<const int32_t> seq, int32_t n) { return suffix_index_->Draft(seq, n, o); };
  }
  Result<Drafter::Draft> d = job.drafter->Next(job.history, most, nullptr, shared);  // never fails without a model
  if (d->from_extra) metrics_->spec_index_drafts++;
  job.gated = d->gated;
  FinishDraft(slot, d->tokens);
  return false;
}

void Engine::DraftWithModel(std::span<Slot* const> slots) {
  if (slots.empty()) return;
  std::vector<ModelDraft> drafts;  // [slots]
  for (Slot* s : slots) {
    drafts.push_back({.draft = s->draft.get(), .sequence = s->job->history, .max_tokens = s->job->model_draft_want,
                      .min_probability = s->job->spec.speculation.min_draft_probability, .tokens = {}});
  }
  const auto start = std::chrono::steady_clock::now();
  double catch_up = 0;  // the catch-up pass's seconds: timed apart, as Drafter::Next times them
  const Result<int32_t> passes = DraftByModels(drafts, &catch_up);
  // The slots' drafts share these passes as their verify passes share a step: each is charged the
  // whole time, as each is charged its step's (Record).
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count() - catch_up;
  if (!passes.ok()) {
    // Which session failed is not known, and a failed pass clears them all: new ones next time;
    // this step runs without drafts.
    Log(LogLevel::kWarning, "serve: the draft model: " + passes.status().message());
    for (Slot* s : slots) s->draft.reset();
    return;
  }
  metrics_->spec_draft_model_passes += *passes;
  for (size_t i = 0; i < slots.size(); ++i) {
    if (drafts[i].caught_up > 0) slots[i]->job->drafter->RecordCatchUp(drafts[i].caught_up, catch_up);
    slots[i]->job->drafter->RecordModelDraft(slots[i]->job->model_draft_want,
                                            static_cast<int32_t>(drafts[i].tokens.size()), seconds);
    FinishDraft(*slots[i], drafts[i].tokens);
  }
}

void Engine::FinishDraft(Slot& slot, std::span<const int32_t> draft) {
  Job& job = *slot.job;
  const int32_t drafted = static_cast<int32_t>(draft.size()) < job.spec.min_draft ? 0 : static_cast<int32_t>(draft.size());
  slot.pass.insert(slot.pass.end(), draft.begin(), draft.begin() + drafted);
  for (int32_t i = 0; i < drafted; ++i) slot.rows.push_back(i);
  if (job.gated) metrics_->spec_gated_steps++;
  // A hybrid's recurrent state cannot drop the draft's tokens: the state before the pass is kept
  // to go back to (AdvanceDrafted).
  if (drafted > 0 && model_.info().state_bytes > 0) {
    const std::span<const float> state = slot.session->recurrent_state();
    job.checkpoint.assign(state.begin(), state.end());
  }
}

int32_t Engine::AdvanceDrafted(Slot& slot, double seconds) {
  Job& job = *slot.job;
  const int32_t drafted = static_cast<int32_t>(slot.pass.size()) - 1;
  if (drafted == 0) {
    if (job.drafter) job.drafter->Record(0, 0, seconds, job.gated);
    Advance(slot);
    return 0;
  }
  Session& session = *slot.session;
  const int64_t before = session.positions() - (drafted + 1);  // held before the step
  const int32_t vocab = model_.info().vocab_size;
  GeneratorStep last;  // the last drafted token's, when one was taken
  const std::span<const float> chosen = session.chosen_logits();  // [drafted, vocab]
  const Result<DraftJudgement> judged = JudgeDraft(
      slot.pass, chosen, vocab,
      [&](std::span<const float> row, int64_t unrun) { return Draw(slot, row, unrun); },
      [&](int32_t token, std::span<const float> row, int32_t previous) {
        last = Take(slot, token, row, previous);
        return !last.finished;
      });
  if (!judged.ok()) {
    Finish(slot, FinishReason::kStop, ServerError(judged.status().message()));
    return 0;
  }
  const int32_t accepted = judged->accepted;  // kept in the cache
  // Ends the judging: records the pass (what the target agreed with: judged->matched()) and drops
  // the drafted tokens not kept from the cache.
  auto settle = [&]() -> bool {
    job.drafter->Record(drafted, judged->matched(), seconds, false, judged->ended);
    metrics_->spec_drafts++;
    metrics_->spec_draft_tokens += drafted;
    metrics_->spec_accepted_tokens += judged->matched();
    {
      std::lock_guard<std::mutex> lock(job.mu);  // the request's own counts, read by its HTTP thread
      job.usage.drafted_tokens += drafted;
      job.usage.accepted_tokens += judged->matched();
    }
    if (Status st = KeepDraftedPrefix(session, before, slot.pass, 1 + accepted, job.checkpoint); !st.ok()) {
      Finish(slot, FinishReason::kStop, ServerError("dropping a rejected draft: " + st.message()));
      return false;
    }
    return true;
  };
  if (judged->ended) {  // a drafted token ran, but the completion ends before it: not kept
    if (settle()) Finish(slot, OpenAiFinishReason(last.finish));
    return accepted;
  }
  if (judged->drawn >= 0) {  // rejected: the drawn token runs next instead
    // A copy: dropping the draft (Truncate) may run tokens again and replace chosen_logits.
    job.row.assign(chosen.begin() + int64_t{accepted} * vocab,
                   chosen.begin() + int64_t{accepted + 1} * vocab);
    if (!settle()) return accepted;
    const GeneratorStep step = Take(slot, judged->drawn, job.row, slot.pass[accepted]);
    if (step.finished) {
      Finish(slot, OpenAiFinishReason(step.finish));
    } else {
      slot.next_token = judged->drawn;
    }
    return accepted;
  }
  // Every drafted token kept: the next is drawn from the logits after the last.
  if (settle()) Advance(slot);
  return accepted;
}

}  // namespace kvq::server
