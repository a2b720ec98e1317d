// The C API's speculative decoding (include/kvq.h: kvq_session_set_speculation and the counts of
// the last generate) over kvq::SpeculationOptions: the setting is kept on the session and given to
// every kvq_session_generate* call (c_api_generate.cc reads it), which Session::Generate runs.
#include <fmt/format.h>

#include <cstddef>
#include <cstring>
#include <string>

#include "api/c_api_internal.h"
#include "kvq/kv_spec.h"

namespace {

using kvq::capi::Fail;
using kvq::capi::Guard;
using kvq::capi::Missing;

// The first published sizes (kvq::capi::ReadStruct): fields appended later get their defaults.
constexpr size_t kSpeculationOptionsFirstSize = sizeof(kvq_speculation_options);
constexpr size_t kSpeculationStatsFirstSize = offsetof(kvq_speculation_stats, draft_prompt_tokens);

}  // namespace

extern "C" {

void kvq_speculation_options_init(kvq_speculation_options* o) {
  if (Missing(o, "kvq_speculation_options_init: options")) return;
  const kvq::SpeculationOptions d;
  *o = {.struct_size = sizeof(kvq_speculation_options),
        .source = KVQ_DRAFT_NONE,
        .max_draft = d.max_draft,
        .max_ngram = d.max_ngram,
        .ungated = d.ungated ? 1 : 0,
        .min_draft_probability = d.min_draft_probability,
        .draft_model = nullptr,
        .draft_kv = nullptr};
}

int kvq_session_set_speculation(kvq_session* session, const kvq_speculation_options* options) {
  constexpr const char* kWhat = "kvq_session_set_speculation";
  if (Missing(session, "kvq_session_set_speculation: session")) return KVQ_ERROR;
  return Guard(kWhat, KVQ_ERROR, [&] {
    if (options == nullptr) {  // none
      session->speculation = {};
      session->draft_model.reset();
      return KVQ_OK;
    }
    kvq_speculation_options o;
    kvq_speculation_options_init(&o);
    if (!kvq::capi::ReadStruct("kvq_session_set_speculation: options", "kvq_speculation_options",
                               kSpeculationOptionsFirstSize, *options, o)) {
      return KVQ_ERROR;
    }
    // kvq_draft_source's values are the indices of kvq::DraftSources().
    const std::span<const kvq::DraftSource> sources = kvq::DraftSources();
    if (o.source < 0 || o.source >= static_cast<int32_t>(sources.size())) {
      std::string names;
      for (size_t i = 0; i < sources.size(); ++i) {
        names += fmt::format("{}{} ({})", i == 0 ? "" : ", ", i, kvq::DraftSourceName(sources[i]));
      }
      return Fail(fmt::format("{}: options.source is {}; expected a kvq_draft_source: {}", kWhat, o.source, names));
    }
    kvq::SpeculationOptions spec{.source = sources[o.source],
                                 .max_draft = o.max_draft,
                                 .min_ngram = 1,
                                 .max_ngram = o.max_ngram,
                                 .min_draft_probability = o.min_draft_probability,
                                 .ungated = o.ungated != 0};
    std::shared_ptr<const kvq::Model> draft;
    if (spec.source == kvq::DraftSource::kModel) {
      if (o.draft_model == nullptr) {
        return Fail(fmt::format("{}: options.draft_model is NULL (KVQ_DRAFT_MODEL drafts with a draft model)", kWhat));
      }
      draft = o.draft_model->model;
      if (kvq::Status st = kvq::CheckDraftVocabulary(*session->model, *draft); !st.ok()) {
        return Fail(fmt::format("{}: options.draft_model: {}", kWhat, st.message()));
      }
      const std::string kv = o.draft_kv != nullptr && o.draft_kv[0] != '\0' ? o.draft_kv : "f16";
      if (kvq::Result<kvq::KvSpec> parsed = kvq::ParseKvSpec(kv); !parsed.ok()) {
        return Fail(fmt::format("{}: options.draft_kv \"{}\": {}", kWhat, kv, parsed.status().message()));
      }
      spec.draft_model = draft.get();
      spec.draft_kv.key_format = kv;
      spec.draft_kv.value_format = kv;
    }
    if (kvq::Status st = kvq::CheckSpeculation(spec); !st.ok()) {
      return Fail(fmt::format("{}: {}", kWhat, st.message()));
    }
    session->speculation = spec;
    session->draft_model = std::move(draft);
    return KVQ_OK;
  });
}

void kvq_speculation_stats_init(kvq_speculation_stats* stats) {
  if (Missing(stats, "kvq_speculation_stats_init: stats")) return;
  *stats = {.struct_size = sizeof(kvq_speculation_stats), .passes = 0, .drafted = 0, .accepted = 0, .gated = 0,
            .draft_prompt_tokens = 0, .gate_resumed = 0};
}

int kvq_session_speculation_stats(const kvq_session* session, kvq_speculation_stats* stats) {
  if (Missing(session, "kvq_session_speculation_stats: session") ||
      Missing(stats, "kvq_session_speculation_stats: stats")) {
    return KVQ_ERROR;
  }
  if (!kvq::capi::CheckStructSize("kvq_session_speculation_stats: stats", "kvq_speculation_stats",
                                  stats->struct_size, kSpeculationStatsFirstSize,
                                  sizeof(kvq_speculation_stats))) {
    return KVQ_ERROR;
  }
  const kvq::SpeculationStats& s = session->last_speculation;
  // Filled whole here, then copied as far as the caller's struct reaches.
  const kvq_speculation_stats full{.struct_size = stats->struct_size,
                                   .passes = s.passes,
                                   .drafted = s.drafted,
                                   .accepted = s.accepted,
                                   .gated = s.gated,
                                   .draft_prompt_tokens = s.draft_prompt_tokens,
                                   .gate_resumed = s.gate_resumed ? 1 : 0};
  std::memcpy(static_cast<void*>(stats), &full, stats->struct_size);
  return KVQ_OK;
}

}  // extern "C"
