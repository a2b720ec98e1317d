// kvq's public C++ API, part 1: a model loaded from a file, its metadata and its tokenizer.
//
//   kvq::Result<std::unique_ptr<kvq::Model>> model = kvq::Model::Load("model.gguf", {.threads = 4});
//   if (!model.ok()) { report(model.status().message()); return; }
//   kvq::Result<std::unique_ptr<kvq::Session>> session = (*model)->NewSession();
//
// A Model is immutable after Load and may be shared by sessions on different threads; each
// Session (kvq/session.h) owns its KV cache and its activations. Errors are returned, not thrown:
// every fallible call returns a Status or Result whose message names the file or option at fault
// (only a failed allocation or an exception thrown by the caller's own callback propagates).
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvq/chat.h"
#include "kvq/kv_cache.h"
#include "kvq/status.h"

namespace kvq {

class Generator;
class Session;

/// kvq's version, "MAJOR.MINOR.PATCH" (static storage).
const char* Version();

/// The K and V specs of one layer: a registry name (`kvq formats` lists them: "f16", "int4", ...)
/// with optional transforms, FORMAT[+rot][+sinkN][+resN] (kvq/kv_spec.h).
struct KvLayerSpec {
  std::string key = "f16";
  std::string value = "f16";
};

/// How a session's KV cache is stored.
struct KvOptions {
  std::string key_format = "f16";    ///< every layer's keys, unless `layers` says otherwise
  std::string value_format = "f16";  ///< every layer's values, unless `layers` says otherwise
  /// Empty, or exactly one entry per layer (a per-layer plan); overrides the two fields above.
  std::vector<KvLayerSpec> layers;
  /// Tier budgets in bytes (device working set, host master, disk folder); see kvq/kv_cache.h.
  /// A budget the cache cannot meet is an error when the session is created.
  KvBudgets budgets;
  /// Positions per cache page (a multiple of 32); 0: min(256, context rounded up to 32).
  int32_t page_positions = 0;
  /// Positions the session holds at most, 1..ModelInfo::context; 0: ModelInfo::context.
  int64_t context = 0;
};

/// Which weight matrices Load repacks into the interleaved layout the fast kernels read (the file
/// is never changed). Repacking copies a matrix into memory the process holds; a dense matrix's
/// mapped pages are released as it is copied, so memory does not grow. A mixture-of-experts
/// model's routed experts are different: left mapped, only the experts tokens route to are read
/// into memory; repacked, every expert is resident (docs/performance.md, "Repacking at load").
enum class Repack {
  /// Dense matrices repacked; the experts too when their copy fits in the memory available (one
  /// line through the log callback says when they are left in the file's layout, and why).
  kAuto = 0,
  kAll = 1,   ///< everything, whatever memory there is
  kNone = 2,  ///< nothing: the file's layout, the slower row kernels, the least memory
};

/// "auto", "all", "none".
const char* RepackName(Repack repack);
/// The Repack named `name`; the error lists the names.
Result<Repack> ParseRepack(std::string_view name);

struct ModelOptions {
  /// llama2.c checkpoints: the tokenizer file (empty: tok512.bin beside the checkpoint). GGUF
  /// files: empty uses the file's own vocabulary; a path replaces it with a llama2.c tokenizer.
  std::string tokenizer_path;
  /// Threads for the matrix products and attention, 1..1024; 0: the machine's hardware threads.
  int32_t threads = 0;
  /// Positions a session holds at most, 1..the model's trained context; 0: the trained context.
  int64_t context = 0;
  /// The KV cache of sessions made by NewSession() (NewSession(KvOptions) overrides it).
  KvOptions kv;
  /// Which matrices are repacked at load. The logits depend on it (a layout has its own order of
  /// f32 sums), so compare runs with the same choice in force.
  Repack repack = Repack::kAuto;
  /// Repack::kAuto: the bytes of memory to count as available; 0: /proc/meminfo's MemAvailable.
  int64_t repack_memory_available = 0;
};

/// What a loaded model is, from its file's metadata (names as llama2.c's).
struct ModelInfo {
  std::string path;          ///< the file Load read
  std::string architecture;  ///< "llama", "mistral", "qwen2", ...
  int32_t n_layers = 0;
  /// Layers with a KV cache: a hybrid model's full-attention layers (its recurrent layers hold a
  /// fixed state instead); n_layers for other models.
  int32_t n_attention_layers = 0;
  /// Bytes of a hybrid model's fixed recurrent state, which every session holds whatever its
  /// length (f32, host RAM); 0 for other models.
  int64_t state_bytes = 0;
  int32_t dim = 0;           ///< residual stream width
  int32_t hidden_dim = 0;    ///< feed-forward width
  int32_t n_heads = 0;
  int32_t n_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t vocab_size = 0;
  int64_t trained_context = 0;  ///< the context the model was trained for (its file says)
  int64_t context = 0;          ///< what sessions hold: ModelOptions::context or trained_context
  float rope_theta = 0;
  int32_t threads = 0;          ///< what the model runs with
  int32_t bos = -1;             ///< -1 when the vocabulary has none
  int32_t eos = -1;             ///< -1 when the vocabulary has none
  /// The GGUF's tokenizer.chat_template (Jinja source), or "" (llama2.c files have none).
  std::string chat_template;
  /// Numbers in the weight matrices (a tied classifier counted once; norms and biases aside).
  int64_t parameters = 0;
  /// The matrices' types by their share of those numbers, largest first: "q4_0 96%, q6_k 4%".
  std::string weight_types;
  /// The SIMD target the matrix kernels run on this machine ("AVX3_ZEN4", "AVX2", "WASM").
  std::string simd_target;
};

enum class AddBos {
  kModelDefault,  ///< what the vocabulary says (llama2.c and SentencePiece models add one)
  kYes,
  kNo,
};

class Model {
 public:
  /// Loads a GGUF file (".gguf") or a llama2.c checkpoint (anything else). Errors name the file
  /// and what was wrong: missing or corrupt file, unsupported architecture or tensor type, an
  /// option out of range, a tokenizer that does not fit the model.
  static Result<std::unique_ptr<Model>> Load(const std::string& path, const ModelOptions& options = {});
  ~Model();
  Model(const Model&) = delete;
  Model& operator=(const Model&) = delete;

  const ModelInfo& info() const;

  /// Token ids of `text`. Control tokens written literally in the text (e.g. "<|im_start|>" in a
  /// vocabulary that has it) become their ids, as llama.cpp's tokenizer with parse_special does.
  std::vector<int32_t> Tokenize(std::string_view text, AddBos add_bos = AddBos::kModelDefault) const;
  /// The text of `ids` as a model writes it (the space a SentencePiece vocabulary adds after BOS
  /// removed, byte pieces joined into UTF-8). Control tokens print as their text.
  /// Errors: an id outside [0, vocab_size).
  Result<std::string> Detokenize(std::span<const int32_t> ids) const;
  /// The text `token` adds when it follows `previous` in a sequence, as generation prints it (a
  /// SentencePiece vocabulary's leading space is dropped only after BOS; a byte piece is its byte,
  /// so a token may hold part of a UTF-8 character); "" for control tokens and ids out of range.
  std::string TokenText(int32_t previous, int32_t token) const;
  /// The text of one token as the vocabulary stores it, SentencePiece's U+2581 shown as a space
  /// (" the", "<0x0A>", "<|im_end|>"); an empty string when id is out of range.
  std::string TokenPiece(int32_t id) const;
  /// Whether generation stops at `id` (EOS, end-of-turn tokens such as <|eot_id|> or <|im_end|>).
  bool IsEndOfGeneration(int32_t id) const;

  /// The prompt text of a conversation: `messages` rendered by the model's chat template
  /// (ModelInfo::chat_template, parsed on first use), or by ChatML when the model has none kvq can
  /// run (chat_template_choice() says which), or by options.template_override; the vocabulary's
  /// BOS and EOS texts are the template's bos_token and eos_token. kvq's Jinja renders as
  /// transformers' apply_chat_template does (tested byte for byte against @huggingface/jinja).
  /// Errors: an override that does not parse ("chat template LINE:COLUMN: what"), a conversation
  /// the template refuses (exactly its raise_exception text), a render past its limits.
  Result<std::string> ApplyChatTemplate(std::span<const ChatMessage> messages,
                                        const ChatTemplateOptions& options = {}) const;
  /// Which template ApplyChatTemplate renders with when no override is given.
  const ChatTemplateChoice& chat_template_choice() const;
  /// The ids of a prompt ApplyChatTemplate rendered: Tokenize(text), except that a text starting
  /// with the BOS token's text (a template that writes BOS itself, as Llama 2's and 3's do) is
  /// BOS then Tokenize(the rest, AddBos::kNo): one BOS, whatever the vocabulary's rule, and the
  /// BOS id even where Tokenize does not parse that text (SentencePiece's "<s>"); a text without
  /// it gets the vocabulary's rule (BOS or none). The ids llama.cpp's chat path gives: it strips a
  /// leading BOS text where the vocabulary adds BOS (common_chat_templates_apply) and otherwise
  /// parses the text it keeps as the BOS token, never two (its tokenizer warns of a doubled BOS).
  std::vector<int32_t> TokenizeChatPrompt(std::string_view text) const;
  /// Whether `source` is a chat template kvq can run (template_override's check, made before a
  /// conversation starts); the error names the construct and its line:column.
  static Status CheckChatTemplate(std::string_view source);

  /// What snapshots and plan files are checked against: the attention shape and a hash of the
  /// weights (computed on first use, once per model; it reads every weight byte).
  const ModelFingerprint& fingerprint() const;

  /// A session with the model's KV options, or with `kv` instead. Errors: an unknown format, a
  /// format that cannot store this head size, budgets that cannot hold the context.
  Result<std::unique_ptr<Session>> NewSession() const;
  Result<std::unique_ptr<Session>> NewSession(const KvOptions& kv) const;

  struct Impl;  ///< internal
  /// The loaded state (api/api_internal.h), read-only: for the WebAssembly shim, which builds its
  /// WebGPU step program from the weights this model already holds (no second copy).
  const Impl& impl() const { return *impl_; }

 private:
  friend class Generator;  // keeps the vocabulary alive for a completion
  explicit Model(std::shared_ptr<Impl> impl);
  std::shared_ptr<Impl> impl_;
};

}  // namespace kvq
