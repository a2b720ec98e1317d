/* kvq's C API: the C++ API of kvq/model.h and kvq/session.h behind opaque handles, for C programs
 * and any FFI (Python ctypes, Rust, Go, ...).
 *
 * Conventions. Functions that can fail return KVQ_OK (0) or KVQ_ERROR; the message of the last
 * failure on the calling thread is kvq_last_error() (valid until the next failing call on that
 * thread). Functions that return a handle return NULL on failure. Strings passed in are UTF-8 and
 * NUL-terminated; strings kvq returns are owned by kvq and stay valid as documented per call.
 * Handles are freed with their *_free function (NULL is accepted); a NULL handle passed anywhere
 * else is an error (KVQ_ERROR, -1 or NULL, with a message), not a crash, and no C++ exception ever
 * leaves these functions. A model may be shared by sessions used on different threads; one session
 * is used by one thread at a time.
 *
 * Linking. libkvq.so holds all of kvq and exports these functions only (`pkg-config --cflags --libs
 * kvq`, CMake's kvq::shared, or dlopen/ctypes.CDLL at run time). The static libraries (CMake's
 * kvq::kvq) are C++: a C program's CMake project then enables CXX too (project(app LANGUAGES C
 * CXX)) so that they link the C++ runtime.
 *
 * Struct sizes. Every options and info struct starts with `struct_size`, the size of the struct
 * as the caller's kvq.h declares it; its *_init function sets it (and the defaults). Fields are
 * only ever appended, so a newer libkvq reads the fields the caller's size covers and gives the
 * rest their defaults; a size it does not know (0, not set; smaller than the struct's first
 * version; larger than this library's struct: a kvq.h newer than the library) is an error naming
 * the struct and both sizes. Arrays of kvq_chat_message carry no size: their two fields are fixed.
 *
 *   kvq_model_options mo; kvq_model_options_init(&mo);
 *   kvq_model* m = kvq_model_load("model.gguf", &mo);
 *   if (!m) { fprintf(stderr, "%s\n", kvq_last_error()); return 1; }
 *   kvq_session* s = kvq_session_new(m, NULL);
 *   kvq_generate_options go; kvq_generate_options_init(&go); go.max_tokens = 64; go.temperature = 0;
 *   kvq_session_generate(s, "Once upon a time", &go, print_piece, NULL, NULL);
 *   kvq_session_free(s); kvq_model_free(m);
 */
#ifndef KVQ_H_
#define KVQ_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Marks the functions libkvq.so exports (it is built with hidden visibility otherwise). */
#if defined(__GNUC__) || defined(__clang__)
#define KVQ_API __attribute__((visibility("default")))
#else
#define KVQ_API
#endif

#define KVQ_OK 0
#define KVQ_ERROR 1

typedef struct kvq_model kvq_model;     /* a loaded model (kvq::Model) */
typedef struct kvq_session kvq_session; /* a sequence, its KV cache and logits (kvq::Session) */

/* kvq's version, "MAJOR.MINOR.PATCH" (static storage; kvq::Version()). */
KVQ_API const char* kvq_version(void);

/* The message of the last failed call on this thread ("" if none). */
KVQ_API const char* kvq_last_error(void);

/* Diagnostics: level 0 info, 1 warning, 2 error; `message` is valid during the call only.
 * NULL restores the default (stderr). */
typedef void (*kvq_log_fn)(int level, const char* message, void* user_data);
KVQ_API void kvq_set_log_callback(kvq_log_fn fn, void* user_data);

typedef struct {
  size_t struct_size;               /* sizeof(kvq_model_options) (kvq_model_options_init sets it) */
  const char* tokenizer_path;       /* NULL or "": the model file's own / tok512.bin beside it */
  int32_t threads;                  /* 0: hardware threads */
  int64_t context;                  /* 0: the model's trained context */
  const char* kv_key_format;        /* KV spec ("f16", "int4-kivi", "int4+rot+sink4", ...); NULL: "f16" */
  const char* kv_value_format;      /* NULL: "f16" */
  int64_t kv_device_budget_bytes;   /* 0: none (attention reads the master copy in place) */
  int64_t kv_host_budget_bytes;     /* 0: no limit */
  const char* kv_disk_dir;          /* NULL or "": master copy in host RAM */
  /* A per-layer plan: 0, or the model's layer count with kv_layer_key_formats[i] and
   * kv_layer_value_formats[i] naming layer i's formats (then kv_key/value_format are ignored). */
  int32_t n_kv_layers;
  const char* const* kv_layer_key_formats;
  const char* const* kv_layer_value_formats;
  /* Added after the fields above (appended: a caller built against the older struct gets the defaults): */
  int32_t repack;                   /* KVQ_REPACK_AUTO (default), KVQ_REPACK_ALL or KVQ_REPACK_NONE (kvq::Repack) */
  int64_t repack_memory_available;  /* KVQ_REPACK_AUTO: bytes of memory counted as available; 0: MemAvailable */
} kvq_model_options;

/* kvq_model_options.repack: which weight matrices are repacked at load for the fast kernels.
 * AUTO: the dense ones, and a mixture-of-experts model's experts when their copy fits in memory
 * (else they stay mapped from the file, resident only when used); ALL: everything; NONE: nothing. */
enum { KVQ_REPACK_AUTO = 0, KVQ_REPACK_ALL = 1, KVQ_REPACK_NONE = 2 };

/* Fills `options` with struct_size and the defaults above. */
KVQ_API void kvq_model_options_init(kvq_model_options* options);

/* Loads a GGUF or llama2.c model; NULL on failure (kvq_last_error says why). options may be NULL. */
KVQ_API kvq_model* kvq_model_load(const char* path, const kvq_model_options* options);
KVQ_API void kvq_model_free(kvq_model* model);

typedef struct {
  size_t struct_size;       /* set by the caller: sizeof(kvq_model_info) (kvq_model_info_init sets it) */
  const char* architecture; /* owned by the model */
  int32_t n_layers, dim, hidden_dim, n_heads, n_kv_heads, head_dim, vocab_size;
  int64_t trained_context, context;
  int32_t threads, bos, eos; /* bos/eos: -1 when the vocabulary has none */
  /* Added after the fields above (appended, so code written for them still compiles and runs): */
  int32_t n_attention_layers; /* layers with a KV cache: a hybrid's full-attention layers, else n_layers */
  int64_t state_bytes;        /* a hybrid's fixed recurrent state per session, bytes; 0 otherwise */
  const char* chat_template;  /* tokenizer.chat_template (Jinja source) or ""; owned by the model */
} kvq_model_info;

/* Zeroes `info` and sets its struct_size. */
KVQ_API void kvq_model_info_init(kvq_model_info* info);
/* Fills the fields info->struct_size covers. KVQ_ERROR for a NULL argument or a size it does not
 * know (nothing written then). */
KVQ_API int kvq_model_get_info(const kvq_model* model, kvq_model_info* info);

/* Tokenizes `text` (add_bos: -1 the vocabulary's default, 0 no, 1 yes) into ids[0..capacity).
 * Returns the number of tokens, which may exceed capacity (then call again with a larger buffer),
 * or -1 on error. */
KVQ_API int64_t kvq_tokenize(const kvq_model* model, const char* text, int add_bos, int32_t* ids, int64_t capacity);

/* The text of ids[0..n) into out[0..capacity) with a terminating NUL. Returns the text's length in
 * bytes (without the NUL; if >= capacity the text was cut: call again), or -1 on error. */
KVQ_API int64_t kvq_detokenize(const kvq_model* model, const int32_t* ids, int64_t n, char* out, int64_t capacity);

/* Non-zero if generation stops at `token` (EOS, end-of-turn). */
KVQ_API int kvq_is_end_of_generation(const kvq_model* model, int32_t token);

/* A session with the model's KV options; or, with kv_override, with its kv_* fields instead (formats,
 * NULL meaning f16; budgets; disk folder — its other fields are ignored). NULL on failure. */
KVQ_API kvq_session* kvq_session_new(const kvq_model* model, const kvq_model_options* kv_override);
KVQ_API void kvq_session_free(kvq_session* session);

/* Runs ids[0..n) after what the session holds. */
KVQ_API int kvq_session_prefill(kvq_session* session, const int32_t* ids, int64_t n);
/* The same, also keeping the logits after each token ids[logits_at[j]] for j in [0, n_at): the
 * indices increase and lie in [0, n) (an error names the one that does not; nothing runs then).
 * Each row equals, bit for bit, the logits that decoding the tokens one at a time gives after that
 * token: what a speculative-decoding verifier reads. kvq_session_chosen_logits returns them. */
KVQ_API int kvq_session_prefill_logits_at(kvq_session* session, const int32_t* ids, int64_t n,
                                          const int32_t* logits_at, int64_t n_at);
/* [*n_rows][vocab_size] the rows the session's last prefill_logits_at kept, valid until the session
 * next changes; NULL (and *n_rows 0) when there are none: after any other call that runs tokens,
 * and after an error. n_rows may be NULL. */
KVQ_API const float* kvq_session_chosen_logits(const kvq_session* session, int64_t* n_rows);
/* One decode step. */
KVQ_API int kvq_session_decode(kvq_session* session, int32_t token);
/* Runs tokens[i][0..n_tokens[i]) after what sessions[i] holds, for every i in [0, n_items), in one
 * forward pass per block of 64 tokens (kvq::Session::RunBatch): each weight matrix is read once for
 * the whole batch, and each session ends with exactly the logits and cache that
 * kvq_session_prefill of its tokens alone gives. A decode step of N sessions is N items of one
 * token. The sessions are distinct and of one model; none may be used by another thread during
 * the call. Errors, before anything runs (the message names the item): n_items < 1, a NULL array,
 * session or token list, n_tokens[i] < 1, an id outside the vocabulary, a session given twice or
 * of another model, more positions than a session's context. A cache error while running clears
 * every session of the batch. */
KVQ_API int kvq_session_run_batch(kvq_session* const* sessions, const int32_t* const* tokens,
                                  const int64_t* n_tokens, int32_t n_items);
/* Threads the session's forward passes use from now on, 1..1024 (sessions start with the model's);
 * no count changes a bit of the results (kvq::Session::SetThreads). */
KVQ_API int kvq_session_set_threads(kvq_session* session, int32_t threads);
/* Sets a function that kvq_session_prefill, kvq_session_run_batch and kvq_session_generate ask,
 * between blocks of 64 prompt tokens and before sampling each generated token, whether to stop
 * (non-zero: stop); fn NULL removes it. It is called on the thread running the session, with
 * `user`, and must not use the session (kvq::Session::SetAbortCallback). When it fires, prefill and
 * run_batch return KVQ_ERROR with a message saying it was aborted and how many positions each
 * session holds: the sessions stay valid and hold the blocks that ran (running the rest later gives
 * the bits of an uninterrupted run); generate succeeds with KVQ_FINISH_CANCELLED. */
typedef int (*kvq_abort_fn)(void* user);
KVQ_API int kvq_session_set_abort_callback(kvq_session* session, kvq_abort_fn fn, void* user);
/* [vocab_size] logits after the last token, valid until the session next changes; NULL if none. */
KVQ_API const float* kvq_session_logits(const kvq_session* session);
KVQ_API int64_t kvq_session_positions(const kvq_session* session);
KVQ_API int64_t kvq_session_kv_bytes(const kvq_session* session);
KVQ_API int kvq_session_truncate(kvq_session* session, int64_t n_positions);
KVQ_API int kvq_session_clear(kvq_session* session);
KVQ_API int kvq_session_save_prefix(const kvq_session* session, const char* path);
/* Returns the positions loaded, or -1 on error (the session is unchanged then). */
KVQ_API int64_t kvq_session_load_prefix(kvq_session* session, const char* path);

typedef struct {
  size_t struct_size; /* sizeof(kvq_generate_options) (kvq_generate_options_init sets it) */
  int32_t max_tokens; /* default 256; < 0: until an end token or the context is full */
  float temperature;  /* default 0.8; 0: greedy */
  int32_t top_k;      /* default 40; 0: off */
  float top_p;        /* default 0.95; 1: off */
  float min_p;        /* default 0.05; 0: off */
  uint64_t seed;      /* default 0 */
  /* Added after the fields above (appended, so code written for them still compiles and runs): */
  const char* const* stop; /* NULL, or n_stop non-empty strings: the text ends before the first one */
  int32_t n_stop;          /* default 0 */
  int32_t ignore_eos;      /* default 0; non-zero: end tokens do not end the completion */
  /* Output constrained to a grammar (kvq::GenerateRequest::grammar): at most one of the two, NULL
   * or "" meaning none. grammar: GBNF, llama.cpp's syntax, start rule "root". json_schema: a JSON
   * Schema as JSON text, turned into GBNF (kvq::JsonSchemaGrammar; the subset supported is in
   * docs/serving.md). A bad grammar or schema fails the call with a message naming it. */
  const char* grammar;
  const char* json_schema;
} kvq_generate_options;

/* Why a kvq_session_generate ended (kvq::FinishReason). */
typedef enum {
  KVQ_FINISH_STOP = 0,      /* an end token (EOS, end-of-turn, BOS) or a stop string */
  KVQ_FINISH_LENGTH = 1,    /* max_tokens were generated */
  KVQ_FINISH_CONTEXT = 2,   /* the session's context is full */
  KVQ_FINISH_CANCELLED = 3  /* on_token returned 0, or the abort callback fired */
} kvq_finish_reason;

KVQ_API void kvq_generate_options_init(kvq_generate_options* options);

/* Sets the sampler chain kvq_session_sample uses (temperature .. seed; its generator re-seeded). */
KVQ_API void kvq_session_set_sampler(kvq_session* session, const kvq_generate_options* options);
/* A token drawn from the session's logits by its sampler chain; -1 on error (no logits yet). */
KVQ_API int32_t kvq_session_sample(kvq_session* session);

/* Called with each generated token and the text that may be shown now (valid during the call;
 * text that may begin a stop string, or an incomplete UTF-8 character, arrives with a later
 * token); return 0 to stop. kvq::TokenCallback says when it is called. */
typedef int (*kvq_token_fn)(int32_t token, const char* piece, void* user_data);

/* Generates a completion of `prompt` (the whole text; what the session holds is reused when it is a
 * prefix of the prompt's tokens). on_token may be NULL. If n_generated is non-NULL it receives the
 * number of tokens generated (0 on failure). Why it ended: kvq_session_finish_reason. */
KVQ_API int kvq_session_generate(kvq_session* session, const char* prompt, const kvq_generate_options* options,
                                 kvq_token_fn on_token, void* user_data, int64_t* n_generated);
/* The same for a prompt already tokenized: ids[0..n) (BOS included when wanted), e.g. from
 * kvq_tokenize_chat_prompt. */
KVQ_API int kvq_session_generate_tokens(kvq_session* session, const int32_t* ids, int64_t n,
                                        const kvq_generate_options* options, kvq_token_fn on_token,
                                        void* user_data, int64_t* n_generated);

/* A generator: the rules of kvq_session_generate (end tokens, ignore_eos, max_tokens, stop strings,
 * whole UTF-8 characters, the context, a grammar) for a caller that runs its own loop — samples
 * with its own code, or runs the model elsewhere (kvq::Generator). options' max_tokens, stop,
 * n_stop, ignore_eos, grammar and json_schema apply; the sampler fields are not used (the caller
 * samples). Free with kvq_generator_free; a generator keeps its model's vocabulary alive. */
typedef struct kvq_generator kvq_generator;

/* What one token handed to kvq_generator_next decided (kvq::GeneratorStep). */
typedef struct {
  size_t struct_size;    /* sizeof(kvq_generator_step): set it before the call */
  const char* text;      /* text that may be shown now (text_bytes bytes, NUL-terminated), valid
                          * until the next call on the generator; bytes that may begin a stop
                          * string, or an incomplete UTF-8 character, come with a later step */
  int64_t text_bytes;
  int32_t kept;          /* the token is part of the completion (0 only for an end token) */
  int32_t run;           /* run the token (kvq_session_decode) before sampling the next */
  int32_t finished;      /* nothing more is generated */
  int32_t finish_reason; /* a kvq_finish_reason once finished; -1 before */
} kvq_generator_step;

/* A generator for the completion that follows what `session` holds now (its prompt run, so that
 * its logits give the first token). NULL on error (a session holding no tokens, bad options). */
KVQ_API kvq_generator* kvq_generator_new(const kvq_session* session, const kvq_generate_options* options);
/* The same for a sequence a runner other than a kvq_session holds: `model`'s vocabulary, the last
 * token run, the positions held (1..context) and the most the sequence can hold. */
KVQ_API kvq_generator* kvq_generator_new_for_sequence(const kvq_model* model, int32_t last_token,
                                                      int64_t positions, int64_t context,
                                                      const kvq_generate_options* options);
KVQ_API void kvq_generator_free(kvq_generator* generator);
/* With a grammar: sets to -infinity the logits[0..n) (n = the vocabulary size) of every token the
 * grammar refuses next; without one: nothing. Call it before sampling each token. */
KVQ_API int kvq_generator_constrain(kvq_generator* generator, float* logits, int64_t n);
/* Hands the generator the token sampled after the last token run; `step` receives what it decided.
 * A token after the end gives a finished step with no text. */
KVQ_API int kvq_generator_next(kvq_generator* generator, int32_t token, kvq_generator_step* step);
/* Ends the completion as cancelled (held-back text is not released). */
KVQ_API int kvq_generator_cancel(kvq_generator* generator, kvq_generator_step* step);
/* The completion's whole text so far (cut before a stop string), NUL-terminated, valid until the
 * next call on the generator; *bytes (if non-NULL) receives its length. NULL on error. */
KVQ_API const char* kvq_generator_text(const kvq_generator* generator, int64_t* bytes);
/* The kept tokens into ids[0..capacity); returns their count (may exceed capacity), -1 on error. */
KVQ_API int64_t kvq_generator_tokens(const kvq_generator* generator, int32_t* ids, int64_t capacity);

/* Chat. A conversation becomes prompt text through the model's chat template (Jinja, from the
 * model file's tokenizer.chat_template; ChatML when it has none kvq can run) and that text becomes
 * ids through kvq_tokenize_chat_prompt: kvq::Model::ApplyChatTemplate and TokenizeChatPrompt. */
typedef struct {
  const char* role;    /* "system", "user", "assistant" (the template decides what else it accepts) */
  const char* content; /* UTF-8 text */
} kvq_chat_message;

typedef struct {
  size_t struct_size;            /* sizeof(kvq_chat_options) (kvq_chat_options_init sets it) */
  int32_t add_generation_prompt; /* default 1: end with the header of the assistant's turn */
  int32_t enable_thinking;       /* default -1: the template decides; 0 or 1: its enable_thinking */
  const char* template_override; /* NULL or "" (default): the model's template; else Jinja source */
} kvq_chat_options;

KVQ_API void kvq_chat_options_init(kvq_chat_options* options);

/* The prompt text of messages[0..n_messages) into out[0..capacity) with a terminating NUL (options
 * may be NULL: the defaults). Returns the text's length in bytes (if >= capacity the text was cut:
 * call again with a larger buffer), or -1 on error (a template that does not parse, a conversation
 * the template refuses: its message). */
KVQ_API int64_t kvq_apply_chat_template(const kvq_model* model, const kvq_chat_message* messages,
                                        int64_t n_messages, const kvq_chat_options* options, char* out,
                                        int64_t capacity);
/* The ids of a prompt kvq_apply_chat_template rendered (one BOS, whether the template writes it or
 * the vocabulary adds it), into ids[0..capacity); returns the count (may exceed capacity: call
 * again) or -1 on error. */
KVQ_API int64_t kvq_tokenize_chat_prompt(const kvq_model* model, const char* text, int32_t* ids,
                                         int64_t capacity);
/* Renders messages[0..n_messages) with chat_options (NULL: the defaults), tokenizes the text as
 * kvq_tokenize_chat_prompt does and generates the reply as kvq_session_generate_tokens does: the
 * assistant's next message. */
KVQ_API int kvq_session_generate_chat(kvq_session* session, const kvq_chat_message* messages,
                                      int64_t n_messages, const kvq_chat_options* chat_options,
                                      const kvq_generate_options* options, kvq_token_fn on_token,
                                      void* user_data, int64_t* n_generated);

/* The kvq_finish_reason of the session's last successful kvq_session_generate*; -1 if none (or on a
 * NULL session). */
KVQ_API int kvq_session_finish_reason(const kvq_session* session);

/* Speculative decoding (kvq/speculation.h): tokens are drafted cheaply and checked in one pass; the
 * output is the same, token for token (greedy; sampled too for the same seed), in fewer passes
 * when drafts are kept. The session's setting applies to its kvq_session_generate* calls from now
 * on. Sources, in kvq::DraftSources()'s order: */
typedef enum {
  KVQ_DRAFT_NONE = 0,   /* no speculation (the default) */
  KVQ_DRAFT_NGRAM = 1,  /* prompt lookup: what followed the text's last n-gram earlier in it */
  KVQ_DRAFT_SUFFIX = 2, /* the most frequent continuation of the text's longest suffix seen before */
  KVQ_DRAFT_MODEL = 3   /* a draft model's greedy continuation (draft_model) */
} kvq_draft_source;

typedef struct {
  size_t struct_size;             /* sizeof(kvq_speculation_options) (kvq_speculation_options_init sets it) */
  int32_t source;                 /* a kvq_draft_source; default KVQ_DRAFT_NONE */
  int32_t max_draft;              /* drafted tokens per pass at most, 1..64; default 8 */
  int32_t max_ngram;              /* longest n-gram (or suffix) a draft matches, 1..16; default 4 */
  int32_t ungated;                /* default 0; non-zero: every draft runs whole (no gate choosing its length) */
  double min_draft_probability;   /* in (0, 1]; default 0.1: where a suffix or model draft stops */
  /* KVQ_DRAFT_MODEL: a smaller model sharing the session's model's vocabulary (checked here). The
   * session keeps it loaded (kvq_model_free may come first) until another setting replaces it. */
  const kvq_model* draft_model;
  const char* draft_kv;           /* the draft session's KV spec for keys and values; NULL or "": "f16" */
} kvq_speculation_options;

KVQ_API void kvq_speculation_options_init(kvq_speculation_options* options);
/* Sets the session's speculation (options NULL: none). KVQ_ERROR, the session's setting unchanged,
 * for a bad field (named), a draft model of another vocabulary (naming the first id that differs)
 * or a draft KV spec that does not parse. */
KVQ_API int kvq_session_set_speculation(kvq_session* session, const kvq_speculation_options* options);

/* What speculation did in the session's last successful kvq_session_generate* (kvq::SpeculationStats). */
typedef struct {
  size_t struct_size; /* sizeof(kvq_speculation_stats) (kvq_speculation_stats_init sets it) */
  int64_t passes;     /* forward passes during decode, with or without a draft */
  int64_t drafted;    /* drafted tokens run */
  int64_t accepted;   /* of those, kept */
  int64_t gated;      /* passes where a draft existed but the gate ran without it */
  /* KVQ_DRAFT_MODEL: prompt tokens the draft model ran before generation began (the whole prompt,
     or fewer where its session held them from an earlier generate). Added after the fields above:
     a struct_size that stops before it is taken, and the field is not written. */
  int64_t draft_prompt_tokens;
  /* 1: the gate began with what the session's earlier generate with the same source and draft
     settings learnt (kvq::SpeculationStats::gate_resumed), else 0. Added after draft_prompt_tokens,
     likewise: a struct_size that stops before it leaves it unwritten. */
  int32_t gate_resumed;
} kvq_speculation_stats;

/* Zeroes `stats` and sets its struct_size. */
KVQ_API void kvq_speculation_stats_init(kvq_speculation_stats* stats);
/* Fills the fields stats->struct_size covers (zeros before any generate). */
KVQ_API int kvq_session_speculation_stats(const kvq_session* session, kvq_speculation_stats* stats);

#ifdef __cplusplus
} /* extern "C" */
#endif

#endif /* KVQ_H_ */
