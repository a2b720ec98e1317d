// Speculative decoding in the engine (see server/engine.h, JobSpec::speculation): a decoding
// session's segment of the batched step is its sampled token and a draft-free draft of what
// follows (kvq/speculation.h's drafters and gate), and the draft is judged as Session::Generate
// judges it — each position's token drawn by the request's sampler from that position's logits,
// in order, kept while it equals the drafted one — so a request's output is the same with or
// without speculation, alone or among others. Drawing a token and handing it to the request's
// Generator (Draw, Take) are here too: plain decoding (Engine::Advance) shares them.

#include <algorithm>

#include "server/engine.h"

namespace kvq::server {

namespace {
// Penalties read the tokens before each position; a judged position would see the draft's
// unrun tokens after it in the session, so such requests decode one token per step.
bool PenaltiesReadHistory(const SamplerOptions& s) {
  return s.repeat_last_n != 0 && (s.repeat_penalty != 1.0f || s.frequency_penalty != 0.0f || s.presence_penalty != 0.0f);
}

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

Result<int32_t> Engine::Draw(Slot& slot, std::span<const float> logits) {
  Job& job = *slot.job;
  if (!job.generator->has_grammar()) return slot.session->Sample(logits);
  job.constrained.assign(logits.begin(), logits.end());
  job.generator->Constrain(job.constrained);
  return slot.session->Sample(job.constrained);
}

GeneratorStep Engine::Take(Slot& slot, int32_t token, std::span<const float> logits, int32_t previous) {
  Job& job = *slot.job;
  // Logprobs are the model's (the logits before grammar, bias and penalties), read before the
  // token runs; each token's text is as it follows the one before.
  std::optional<LogprobEntry> logprob;
  if (job.spec.top_logprobs >= 0) {
    const TokenLogprobs lp = LogprobsOf(logits, token, job.spec.top_logprobs);
    logprob = LogprobEntry{.token = model_.TokenText(previous, token), .logprob = lp.chosen.logprob, .top = {}};
    for (const TokenLogprob& t : lp.top) logprob->top.emplace_back(model_.TokenText(previous, t.id), t.logprob);
  }
  const GeneratorStep step = job.generator->Next(token);
  if (step.kept) metrics_->generated_tokens++;
  if (!step.kept) logprob.reset();
  if (!step.text.empty() || logprob) job.Publish(step.text, false, FinishReason::kStop, {}, std::move(logprob));
  return step;
}

void Engine::PrepareDraft(Slot& slot) {
  slot.pass.assign(1, slot.next_token);
  slot.rows.clear();
  Job& job = *slot.job;
  const SpeculationOptions& o = job.spec.speculation;
  if (o.source != DraftSource::kNgram && o.source != DraftSource::kSuffix) return;
  if (model_.info().state_bytes > 0 || PenaltiesReadHistory(job.spec.sampling)) return;
  Session& session = *slot.session;
  // A draft fits what the generator can still keep and the context can still hold.
  const int64_t room = std::min<int64_t>(session.context() - session.positions() - 1,
                                         job.spec.max_tokens - static_cast<int64_t>(job.generator->tokens().size()));
  const int32_t most = static_cast<int32_t>(std::clamp<int64_t>(room, 0, o.max_draft));
  if (!job.gate) job.gate.emplace(o.max_draft);
  const std::span<const int32_t> held = session.tokens();
  job.history.assign(held.begin(), held.end());
  job.history.push_back(slot.next_token);
  std::vector<int32_t> draft;
  if (o.source == DraftSource::kSuffix) {
    if (!job.tree) job.tree.emplace(o.max_ngram + o.max_draft);
    for (; job.in_tree < job.history.size(); ++job.in_tree) job.tree->Append(job.history[job.in_tree]);
    draft = job.tree->Draft(job.history, most, o);
  } else {
    draft = DraftByLookup(job.history, most, o);
  }
  int32_t drafted = o.ungated ? static_cast<int32_t>(draft.size()) : job.gate->Choose(static_cast<int32_t>(draft.size()));
  if (drafted < job.spec.min_draft) drafted = 0;
  slot.pass.insert(slot.pass.end(), draft.begin(), draft.begin() + drafted);
  for (int32_t i = 0; i < drafted; ++i) slot.rows.push_back(i);
  if (drafted < static_cast<int32_t>(draft.size())) metrics_->spec_gated_steps++;
}

int32_t Engine::AdvanceDrafted(Slot& slot, double seconds) {
  Job& job = *slot.job;
  const int32_t drafted = static_cast<int32_t>(slot.pass.size()) - 1;
  if (drafted == 0) {
    if (job.gate) job.gate->Record(0, 0, seconds, false);
    Advance(slot);
    return 0;
  }
  Session& session = *slot.session;
  const int64_t before = session.positions() - (drafted + 1);  // held before the step
  const int32_t vocab = model_.info().vocab_size;
  int32_t accepted = 0;
  // Ends the judging: records the pass and drops the drafted tokens not kept from the cache.
  auto settle = [&]() -> bool {
    job.gate->Record(drafted, accepted, seconds, false);
    metrics_->spec_drafts++;
    metrics_->spec_draft_tokens += drafted;
    metrics_->spec_accepted_tokens += accepted;
    if (session.positions() == before + 1 + accepted) return true;
    if (Status st = session.Truncate(before + 1 + accepted); !st.ok()) {
      Finish(slot, FinishReason::kStop, ServerError("dropping a rejected draft: " + st.message()));
      return false;
    }
    return true;
  };
  for (int32_t i = 0; i < drafted; ++i) {
    // A copy: dropping the draft (Truncate) may run tokens again and replace chosen_logits.
    const std::span<const float> chosen = session.chosen_logits();
    job.row.assign(chosen.begin() + int64_t{i} * vocab, chosen.begin() + int64_t{i + 1} * vocab);
    const Result<int32_t> token = Draw(slot, job.row);
    if (!token.ok()) {
      Finish(slot, FinishReason::kStop, ServerError(token.status().message()));
      return accepted;
    }
    if (*token != slot.pass[i + 1]) {  // rejected: the drawn token runs next instead
      if (!settle()) return accepted;
      const GeneratorStep step = Take(slot, *token, job.row, slot.pass[i]);
      if (step.finished) {
        Finish(slot, OpenAiFinishReason(step.finish));
      } else {
        slot.next_token = *token;
      }
      return accepted;
    }
    const GeneratorStep step = Take(slot, *token, job.row, slot.pass[i]);
    if (step.finished) {  // it ran, but the completion ends before it: not kept in the cache
      if (settle()) Finish(slot, OpenAiFinishReason(step.finish));
      return accepted;
    }
    ++accepted;
  }
  // Every drafted token kept: the next is drawn from the logits after the last.
  if (settle()) Advance(slot);
  return accepted;
}

}  // namespace kvq::server
