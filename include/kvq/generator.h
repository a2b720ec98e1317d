// kvq's public C++ API, part 3: the generation rules — when a completion ends, why, and which of
// its text may be shown yet.
//
//   kvq::Result<kvq::Generator> made = kvq::Generator::Create(session, {.max_tokens = 64, .stop = {"\n\n"}});
//   kvq::Generator& g = made.value();               // (check made.ok() first)
//   while (!g.finished()) {                         // the session holds the prompt, run
//     int32_t token = *session.Sample();            // the caller samples (or picks by its own rule)
//     kvq::GeneratorStep step = g.Next(token);      // the generator decides
//     show(step.text);                              // text safe to show now
//     if (step.run) session.Decode(token);          // the caller runs the forward pass
//   }
//
// One Generator per completion. It owns every rule that ends one: end tokens, max_tokens, stop
// strings, the session's context; and the finish reason. It never runs the model, so a single
// loop (Session::Generate, `kvq run`) and a server stepping many sessions through
// Session::RunBatch drive the same object: each keeps a Generator per session and hands it each
// sampled token. It reads the session's model's vocabulary (end tokens as Model::IsEndOfGeneration
// says, token text as Model::TokenText gives it) and nothing else.
//
// A grammar (GeneratorOptions::grammar, GBNF) is a rule of the completion like a stop string, so
// it lives here rather than in the sampler settings: the Generator sees every kept token, knows the
// vocabulary's texts and end tokens, and owns the finish. The caller asks it to Constrain the logits
// before sampling (tokens the grammar refuses get -infinity; end tokens stay only where the grammar
// may end), and the completion finishes (kStop) once the grammar is complete and nothing may follow.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "kvq/model.h"
#include "kvq/status.h"

namespace kvq {

class Session;

/// Why a completion ended.
enum class FinishReason {
  kStop,       ///< an end token (EOS, end-of-turn, BOS) or a stop string
  kLength,     ///< max_tokens were generated
  kContext,    ///< the session's context is full: the last token has no position to run in
  kCancelled,  ///< the caller cancelled (a callback returned false, a client went away)
};

/// "stop", "length", "context" or "cancelled".
const char* FinishReasonName(FinishReason reason);

struct GeneratorOptions {
  int32_t max_tokens = 256;  ///< tokens kept at most; < 0: until an end token or the context is full
  /// The text ends before the first occurrence of any of these (non-empty strings). The token
  /// that completes one is kept in tokens(), and its text before the stop string is in text().
  std::vector<std::string> stop;
  /// End tokens do not end the completion: they are kept like any token (their text is "").
  bool ignore_eos = false;
  /// GBNF (llama.cpp's grammar syntax, start rule "root") the completion's text must follow when
  /// the caller Constrains the logits before each sample; empty: none.
  std::string grammar;
  /// Control tokens whose text the completion keeps, by text (Mistral's "[TOOL_CALLS]"), as
  /// llama.cpp's preserved tokens: a control token's text is "", so without this a grammar could
  /// never ask for it and a reply parser would never see it. Each text that is a control token of
  /// the model's vocabulary puts that text in text() and the steps, and a grammar allows the
  /// token where it allows the text; where the grammar can go on only by writing that text, the
  /// control token is the one allowed (the text spelled in ordinary pieces is refused). A text the
  /// vocabulary has no control token for is ignored: there it is ordinary text.
  std::vector<std::string> preserved_tokens;
};

/// The GBNF of the JSON texts a JSON Schema (given as JSON text) accepts, for GeneratorOptions::
/// grammar. The subset supported, and what is refused: docs/serving.md. Errors name the keyword
/// and where it is in the schema.
Result<std::string> JsonSchemaGrammar(std::string_view schema_json);
/// The GBNF of any JSON object (OpenAI's response_format {"type": "json_object"}).
std::string JsonObjectGrammar();

/// What one sampled token decided.
struct GeneratorStep {
  /// Text that may be shown now: this token's text, plus text held back by earlier tokens that
  /// this one settled. Bytes that could begin a stop string, and an incomplete UTF-8 character,
  /// are held back until a later token (or the end) decides them; so the concatenated steps'
  /// text never shows part of a stop string, and is text() once finished (unless cancelled).
  std::string text;
  bool kept = false;      ///< the token is part of the completion (false only for an end token)
  bool run = false;       ///< the caller runs the token (Decode) before sampling the next
  bool finished = false;  ///< nothing more is generated; `finish` says why
  FinishReason finish = FinishReason::kStop;
};

class GrammarMatcher;

class Generator {
 public:
  ~Generator();
  Generator(Generator&&) noexcept;
  Generator& operator=(Generator&&) noexcept;

  /// Checks options without a model: errors name the field ("GeneratorOptions::stop[1] is empty").
  static Status Check(const GeneratorOptions& options);
  /// A generator for the completion that follows what `session` holds now: the prompt, run, so
  /// that its logits give the first token. The session is read here only (its model, last token,
  /// positions and context); the generator keeps the model's vocabulary alive. With max_tokens 0
  /// it is finished at once (kLength). Errors: Check's; a session holding no tokens.
  static Result<Generator> Create(const Session& session, const GeneratorOptions& options);
  /// The same for a sequence that a runner other than a Session holds (the page's WebGPU path
  /// keeps its own cache): `model`'s vocabulary, the last token run (its logits give the first
  /// token), the positions held (>= 1) and the most the sequence can hold (>= positions).
  /// Errors: Check's; a last token outside the vocabulary; positions outside [1, context].
  static Result<Generator> Create(const Model& model, int32_t last_token, int64_t positions, int64_t context,
                                  const GeneratorOptions& options);

  /// With a grammar: sets to -infinity the logits [vocab_size] of every token whose text the
  /// grammar refuses next (tokens without text included), and of the end tokens unless the grammar
  /// may end here. If the grammar leaves no token at all (the vocabulary cannot spell what it
  /// needs), the end tokens are left so that the completion can end. Without a grammar: nothing.
  void Constrain(std::span<float> logits);
  bool has_grammar() const { return grammar_ != nullptr; }

  /// Hands the generator the token sampled from the logits after the last token run. Tokens
  /// after finished() are refused with a finished step holding no text. With a grammar, a token
  /// whose text it refuses (logits not Constrained) ends the completion (kStop) unkept; a token
  /// after which the grammar is complete with nothing left to follow ends it (kStop) kept.
  GeneratorStep Next(int32_t token);
  /// Ends the completion as cancelled (no-op once finished). Held-back text is not released: a
  /// cancelling caller has stopped reading; text() still has it.
  GeneratorStep Cancel();

  bool finished() const { return finished_; }
  FinishReason finish_reason() const { return finish_; }  ///< meaningful once finished()
  std::span<const int32_t> tokens() const { return tokens_; }  ///< kept tokens, in order
  /// The completion's text: every kept token's text (TokenText below), cut before the first stop
  /// string.
  const std::string& text() const { return text_; }
  /// Bytes of text() released by steps so far (the rest is held back).
  size_t released_bytes() const { return released_; }
  /// The text `token` adds to text() when it follows `previous`: Model::TokenText, or for a
  /// control token kept as text (GeneratorOptions::preserved_tokens) that text. What a server
  /// shows as a token's text in logprobs, so that they spell the output.
  std::string TokenText(int32_t previous, int32_t token) const;

 private:
  Generator(std::shared_ptr<const Model::Impl> model, GeneratorOptions options, int32_t previous,
            int64_t positions, int64_t context, std::unique_ptr<GrammarMatcher> grammar);
  // Both Creates, once their inputs are checked.
  static Result<Generator> Make(std::shared_ptr<const Model::Impl> model, int32_t last_token, int64_t positions,
                                int64_t context, const GeneratorOptions& options);
  // Bytes at the end of text_ that may begin a stop string or are an incomplete UTF-8 character.
  size_t HeldBytes() const;
  // Ends with `reason`; `release` = bytes of text_ the final step may release.
  GeneratorStep Finish(FinishReason reason, bool kept, size_t release);

  std::shared_ptr<const Model::Impl> model_;
  GeneratorOptions options_;
  int32_t previous_;           // the token before the next one (its text depends on it)
  int64_t positions_;          // what the session holds when the next token is sampled
  int64_t context_;            // the session's positions at most
  std::vector<int32_t> tokens_;
  std::string text_;           // generated text; cut at a stop string once one is found
  size_t released_ = 0;        // bytes of text_ handed out by steps
  bool finished_ = false;
  FinishReason finish_ = FinishReason::kStop;
  std::unique_ptr<GrammarMatcher> grammar_;  // null: no grammar
  std::vector<float> end_logits_;            // [end tokens] Constrain's scratch
  // options_.preserved_tokens that are control tokens of the vocabulary: (id, text).
  std::vector<std::pair<int32_t, std::string>> preserved_;
  std::vector<float> preserved_logits_;      // [preserved_] Constrain's scratch
};

}  // namespace kvq
