// The seed corpora (corpus.h): tiny GGUF models of every architecture synth writes and every
// weight type it can quantise, a small byte-level BPE vocabulary, llama.2c checkpoints and
// tokenizers, snapshots of every cache in snapshot_caches.h at several lengths, tokenizer texts,
// and byte sizes, KV specs and plan files.
#include "fuzz/corpus.h"

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include <fmt/format.h>

#include "fuzz/fuzz_util.h"
#include "fuzz/snapshot_caches.h"
#include "gguf/gguf_writer.h"
#include "jinja/chat_template.h"
#include "synth/synth.h"
#include "synth/synth_weight_type.h"
#include "text/bpe_vocabulary.h"
#include "weights/weight_type.h"

namespace kvq::fuzz {

namespace {

namespace fs = std::filesystem;

Status WriteBytes(const fs::path& path, const std::string& bytes) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), static_cast<std::streamsize>(bytes.size()));
  if (!out) return Status::Error("cannot write " + path.string());
  return Status::Ok();
}

Result<std::string> ReadBytes(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return Status::Error("cannot read " + path.string());
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

template <typename T>
void Put(std::string& out, T v) {
  char b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.append(b, sizeof(T));
}

// GPT-2's byte alphabet: the printable Latin-1 bytes stand for themselves, the other 68 bytes for
// U+0100 upwards in byte order; returned as UTF-8, indexed by byte.
std::vector<std::string> ByteAlphabet() {
  std::vector<std::string> out(256);
  int next = 256;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    const int cp = printable ? b : next++;
    if (cp < 0x80) {
      out[b] = std::string(1, static_cast<char>(cp));
    } else {
      out[b] = {static_cast<char>(0xC0 | (cp >> 6)), static_cast<char>(0x80 | (cp & 0x3F))};
    }
  }
  return out;
}

// A byte-level BPE vocabulary of 256 byte tokens, a few merges and an end-of-text control token.
Status WriteBpeVocab(const fs::path& path) {
  const std::vector<std::string> bytes = ByteAlphabet();
  BpeVocabulary v;
  v.tokens = bytes;
  v.token_types.assign(256, 1);
  const std::string space = bytes[' '];
  for (const auto& [left, right] : std::vector<std::pair<std::string, std::string>>{
           {space, "t"}, {"h", "e"}, {space + "t", "he"}, {"o", "n"}, {"i", "n"}, {space, "a"}}) {
    v.merges.push_back(left + " " + right);
    v.tokens.push_back(left + right);
    v.token_types.push_back(1);
  }
  v.tokens.push_back("<|endoftext|>");
  v.token_types.push_back(3);
  v.bos = v.eos = static_cast<int32_t>(v.tokens.size()) - 1;
  v.pre = "qwen2";
  GgufWriter w;
  if (Status s = w.SetString("general.architecture", "llama"); !s.ok()) return s;
  if (Status s = WriteBpeVocabularyGguf(v, static_cast<int64_t>(v.tokens.size()), &w); !s.ok()) return s;
  return w.Write(path.string());
}

// GGUF headers that declare far more than they hold (each must be refused, allocating little):
// counts of 2^60, a key of 2^62 bytes, a string array of 2^40 entries, nested arrays, a tensor
// of 2^124 elements.
std::string GgufHeader(uint64_t n_tensors, uint64_t n_kv) {
  std::string out = "GGUF";
  Put(out, uint32_t{3});
  Put(out, n_tensors);
  Put(out, n_kv);
  return out;
}
void PutGgufString(std::string& out, std::string_view s) {
  Put(out, static_cast<uint64_t>(s.size()));
  out += s;
}

Status WriteGgufLimitProbes(const fs::path& dir) {
  std::vector<std::pair<std::string, std::string>> probes;
  probes.push_back({"counts-2e60", GgufHeader(uint64_t{1} << 60, uint64_t{1} << 60)});
  std::string key = GgufHeader(0, 1);
  Put(key, uint64_t{1} << 62);
  probes.push_back({"key-2e62-bytes", key + "general.architecture"});
  std::string tokens = GgufHeader(0, 1);
  PutGgufString(tokens, "tokenizer.ggml.tokens");
  Put(tokens, uint32_t{9});   // ARRAY
  Put(tokens, uint32_t{8});   // of STRING
  Put(tokens, uint64_t{1} << 40);
  PutGgufString(tokens, "a");
  probes.push_back({"strings-2e40", tokens});
  std::string nested = GgufHeader(0, 1);
  PutGgufString(nested, "tokenizer.ggml.merges");
  Put(nested, uint32_t{9});
  Put(nested, uint32_t{9});  // ARRAY of ARRAY
  Put(nested, uint64_t{1} << 40);
  for (int i = 0; i < 4; ++i) {
    Put(nested, uint32_t{9});
    Put(nested, uint64_t{1} << 40);
  }
  probes.push_back({"nested-arrays-2e40", nested});
  std::string tensor = GgufHeader(1, 0);
  PutGgufString(tensor, "token_embd.weight");
  Put(tensor, uint32_t{4});
  for (int i = 0; i < 4; ++i) Put(tensor, uint64_t{1} << 31);
  Put(tensor, uint32_t{0});  // F32
  Put(tensor, uint64_t{0});
  probes.push_back({"tensor-2e124-elements", tensor + std::string(64, '\0')});
  for (const auto& [name, bytes] : probes) {
    if (Status s = WriteBytes(dir / ("limits-" + name + ".gguf"), bytes); !s.ok()) return s;
  }
  return Status::Ok();
}

Status WriteGgufSeeds(const fs::path& dir) {
  if (Status s = WriteGgufLimitProbes(dir); !s.ok()) return s;
  const fs::path bpe_vocab = dir / "bpe-vocab-only.gguf";
  if (Status s = WriteBpeVocab(bpe_vocab); !s.ok()) return s;
  const std::string spm_vocab = SourcePath("models/stories260K/stories260K.gguf");
  // Every weight type synth can quantise (llama), and a few per other architecture.
  std::vector<std::pair<SynthArch, std::string>> models;
  for (const WeightTypeDesc& t : WeightTypes()) {
    if (SynthWeightType(static_cast<GgmlType>(t.gguf_type)) != nullptr) models.push_back({SynthArch::kLlama, t.name});
  }
  for (SynthArch arch : {SynthArch::kQwen2, SynthArch::kMistral, SynthArch::kQwen3}) {
    for (const char* type : {"f32", "q8_0", "q4_k"}) models.push_back({arch, type});
  }
  for (const auto& [arch, type] : models) {
    Result<const WeightTypeDesc*> desc = SynthWeightTypeByName(type);
    if (!desc.ok()) continue;  // a type this build does not register (q4_k): skipped, not failed
    const int64_t width = std::max<int64_t>(32, (*desc)->block_elems);
    const bool bpe = arch == SynthArch::kQwen2 || arch == SynthArch::kQwen3;
    SynthSpec spec{.name = "fuzz-seed", .arch = arch, .dim = width, .n_layers = 1, .n_heads = 2,
                   .n_kv_heads = 1, .hidden_dim = width, .context = 64,
                   .embeddings = arch == SynthArch::kMistral ? SynthEmbeddings::kTied : SynthEmbeddings::kSeparate,
                   .qkv_bias = arch == SynthArch::kQwen2, .type = type, .seed = 5};
    if (arch == SynthArch::kLlama && std::string_view(type) == "f16") spec.rope_scaling = Llama3RopeScaling{};
    const fs::path out = dir / fmt::format("{}-{}.gguf", SynthArchName(arch), type);
    if (Status s = WriteSynthModel(spec, bpe ? bpe_vocab.string() : spm_vocab, out.string()); !s.ok()) {
      return Status::Error(out.string() + ": " + s.message());
    }
  }
  // The hybrids' tiny presets (Gated DeltaNet, gated attention, experts), in F32.
  for (const char* preset : {"tiny-qwen35", "tiny-qwen35moe", "tiny-qwen3next"}) {
    Result<SynthSpec> found = SynthPreset(preset);
    if (!found.ok()) return found.status();
    SynthSpec spec = *found;
    spec.type = "f32";
    spec.seed = 5;
    const fs::path out = dir / fmt::format("{}-f32.gguf", preset);
    if (Status s = WriteSynthModel(spec, spm_vocab, out.string()); !s.ok()) {
      return Status::Error(out.string() + ": " + s.message());
    }
  }
  return Status::Ok();
}

// A llama2.c checkpoint (run.c's legacy layout, shared classifier) of this shape, random weights.
std::string Llama2cCheckpoint(int32_t dim, int32_t hidden, int32_t layers, int32_t heads, int32_t kv_heads,
                              int32_t vocab, int32_t seq_len) {
  std::string out;
  for (int32_t v : {dim, hidden, layers, heads, kv_heads, vocab, seq_len}) Put(out, v);
  const int64_t d = dim, hd = hidden, L = layers, kv = dim / heads * kv_heads, hs = dim / heads;
  const int64_t floats = vocab * d + L * d + L * d * d + 2 * L * d * kv + L * d * d + L * d + 3 * L * d * hd + d +
                         seq_len * hs;
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(-0.1f, 0.1f);
  for (int64_t i = 0; i < floats; ++i) Put(out, u(rng));
  return out;
}

// A llama2.c tokenizer of `vocab` tokens: <unk>, BOS, EOS, then (with_bytes) the 256 byte pieces,
// then short pieces.
std::string Llama2cTokenizer(int32_t vocab, bool with_bytes) {
  std::vector<std::string> pieces = {"<unk>", "\n<s>\n", "\n</s>\n"};
  if (with_bytes) {
    for (int b = 0; b < 256; ++b) pieces.push_back(fmt::format("<0x{:02X}>", b));
  }
  const char* words[] = {" ", "e", "t", " t", "he", " the", "O", "n", "c", "Once", " upon", "a"};
  for (size_t i = 0; pieces.size() < static_cast<size_t>(vocab); ++i) {
    pieces.push_back(i < std::size(words) ? words[i] : fmt::format("p{}", i));
  }
  std::string out;
  Put(out, int32_t{8});
  for (size_t i = 0; i < pieces.size(); ++i) {
    Put(out, static_cast<float>(i) * -0.5f);
    Put(out, static_cast<int32_t>(pieces[i].size()));
    out += pieces[i];
  }
  return out;
}

std::string Llama2cInput(const std::string& checkpoint, const std::string& tokenizer) {
  std::string out;
  Put(out, static_cast<uint32_t>(checkpoint.size()));
  return out + checkpoint + tokenizer;
}

Status WriteLlama2cSeeds(const fs::path& dir) {
  const std::string small = Llama2cCheckpoint(8, 16, 1, 2, 2, 16, 4);
  if (Status s = WriteBytes(dir / "small-vocab16.bin", Llama2cInput(small, Llama2cTokenizer(16, false))); !s.ok()) return s;
  const std::string bytes = Llama2cCheckpoint(8, 16, 2, 2, 1, 272, 8);
  if (Status s = WriteBytes(dir / "bytes-vocab272.bin", Llama2cInput(bytes, Llama2cTokenizer(272, true))); !s.ok()) return s;
  if (Status s = WriteBytes(dir / "checkpoint-only.bin", Llama2cInput(small, "")); !s.ok()) return s;
  // Declared far past the file: a header of the largest accepted dimensions, and a tokenizer of
  // 2^22 tokens whose first claims 2^31 - 1 bytes.
  std::string huge;
  for (int32_t v : {1 << 16, 1 << 18, 1024, 1 << 10, 1 << 10, 1 << 22, 1 << 24}) Put(huge, v);
  std::string tokenizer;
  Put(tokenizer, int32_t{4096});
  Put(tokenizer, 0.0f);
  Put(tokenizer, int32_t{0x7fffffff});
  std::string header_vocab;
  for (int32_t v : {8, 16, 1, 2, 2, 1 << 22, 4}) Put(header_vocab, v);
  if (Status s = WriteBytes(dir / "limits-huge-header.bin", Llama2cInput(huge, "")); !s.ok()) return s;
  return WriteBytes(dir / "limits-huge-tokenizer.bin", Llama2cInput(header_vocab, tokenizer));
}

Status WriteSnapshotSeeds(const fs::path& dir) {
  std::mt19937 rng(11);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  for (size_t i = 0; i < kSnapshotSpecs.size(); ++i) {
    for (int64_t positions : {0, 5, 40, 64}) {
      Result<KvCacheConfig> config = SnapshotCacheConfig(i);
      if (!config.ok()) return config.status();
      Result<std::unique_ptr<KvCache>> cache = KvCache::Create(*config);
      if (!cache.ok()) return cache.status();
      const int64_t row = int64_t{kSnapshotModel.n_kv_heads} * kSnapshotModel.head_dim;
      std::vector<float> k(positions * row), v(positions * row);  // [positions][n_kv_heads][head_dim]
      for (float& x : k) x = normal(rng);
      for (float& x : v) x = normal(rng);
      for (int64_t layer = 0; layer < kSnapshotModel.n_layers; ++layer) {
        if (Status s = (*cache)->Append(layer, k.data(), v.data(), positions); !s.ok()) return s;
      }
      std::vector<int32_t> tokens;
      for (int64_t t = 0; t < positions; ++t) tokens.push_back(static_cast<int32_t>(rng() % 512));
      const fs::path file = dir / fmt::format("cache{}-{}.raw", i, positions);
      if (Status s = (*cache)->Save(file.string(), kSnapshotModel, tokens); !s.ok()) return s;
      Result<std::string> bytes = ReadBytes(file);
      if (!bytes.ok()) return bytes.status();
      fs::remove(file);
      // Mode byte (snapshot_fuzzer.cc): even repairs checksums, odd loads as is.
      if (positions == 5) {
        // The same file declaring 2^62-byte key blocks and 2^40 residual floats in layer 0 (the
        // fuzz target repairs the header checksum, so the length checks behind it are reached).
        std::string probe = *bytes;
        const uint64_t big = uint64_t{1} << 62, floats = uint64_t{1} << 40;
        std::memcpy(probe.data() + 52 + 31, &big, 8);
        std::memcpy(probe.data() + 52 + 47, &floats, 8);
        const fs::path seed = dir / fmt::format("limits-cache{}-lengths.kvqs", i);
        if (Status s = WriteBytes(seed, std::string(1, '\0') + probe); !s.ok()) return s;
      }
      for (char mode : {'\0', '\1'}) {
        const fs::path seed = dir / fmt::format("cache{}-{}-mode{}.kvqs", i, positions, int{mode});
        if (Status s = WriteBytes(seed, std::string(1, mode) + *bytes); !s.ok()) return s;
      }
    }
  }
  return Status::Ok();
}

Status WriteTextSeeds(const fs::path& dir) {
  const std::vector<std::string> texts = {
      "Once upon a time, there was a little girl named Lily.",
      " Hello  world\n\tthe end ",
      "caf\xc3\xa9 na\xc3\xafve \xe2\x96\x81 \xe6\x97\xa5\xe6\x9c\xac\xe8\xaa\x9e \xf0\x9f\x98\x80",
      "\xff\xfe\xc3(\xe2\x82 \x80\x00\x01 bad utf-8",
      "<|endoftext|><s></s> 12345 + 678 = 'don't' I'm",
      ""};
  for (int vocab = 0; vocab < 3; ++vocab) {
    for (size_t i = 0; i < texts.size(); ++i) {
      for (uint8_t bos : {uint8_t{0}, uint8_t{0x80}}) {
        const std::string input = std::string(1, static_cast<char>(vocab | bos)) + texts[i];
        if (Status s = WriteBytes(dir / fmt::format("vocab{}-text{}-bos{}.txt", vocab, i, bos != 0), input); !s.ok()) {
          return s;
        }
      }
    }
  }
  return Status::Ok();
}

Status WriteParserSeeds(const fs::path& dir) {
  const std::vector<std::string> texts = {"718MB", "16GiB", "1.25GiB", "4096", "512 KiB", "9223372036854775807",
                                          "int4+rot", "int2-kivi+sink4+res64", "fp8-e4m3+prerope",
                                          "f16+res8+sink2", "bf16"};
  for (size_t i = 0; i < texts.size(); ++i) {
    if (Status s = WriteBytes(dir / fmt::format("text{}.txt", i), texts[i]); !s.ok()) return s;
  }
  Result<std::string> plan = ReadBytes(SourcePath("data/plans/stories260K-4.5bits.json"));
  if (!plan.ok()) return plan.status();
  if (Status s = WriteBytes(dir / "plan-kv-bits.json", *plan); !s.ok()) return s;
  const std::string per_token = R"({"kvq_plan": 1, "model": {"n_layers": 2, "n_kv_heads": 2, "head_dim": 8,
  "weights_hash": "0123456789abcdef"}, "positions": 64, "budget": {"bytes_per_token": 1200},
  "layers": [{"k": "int4+rot", "v": "int8"}, {"k": "int2-kivi+sink4", "v": "f16+res8"}],
  "kv_bytes": 1000, "bits_per_number": 4.5, "predicted_kl": 0.01, "measured_kl": 0.02})";
  return WriteBytes(dir / "plan-bytes-per-token.json", per_token);
}

/// Chat templates written for the seeds (no model's own template is committed), each using what
/// real ones do: ChatML, a system default and a namespace over reversed messages (Qwen), headers
/// with trim (Llama 3), role alternation with raise_exception (Llama 2, Gemma), whitespace
/// control, filters and tests, slices and string methods; the last carries a message after a NUL.
Status WriteChatTemplateSeeds(const fs::path& dir) {
  const std::vector<std::string> templates = {
      ChatTemplate::ChatMl().source(),
      "{%- if messages[0].role == 'system' %}{{- '<|im_start|>system\n' + messages[0].content + "
      "'<|im_end|>\n' }}{%- else %}{{- '<|im_start|>system\nYou are helpful.<|im_end|>\n' }}{%- endif %}\n"
      "{%- set ns = namespace(last=messages|length - 1) %}\n"
      "{%- for m in messages[::-1] %}{%- if ns.last == messages|length - 1 and m.role == 'user' %}"
      "{%- set ns.last = (messages|length - 1) - loop.index0 %}{%- endif %}{%- endfor %}\n"
      "{%- for m in messages %}{%- if '</think>' in m.content %}"
      "{%- set content = m.content.split('</think>')[-1].lstrip('\\n') %}{%- else %}"
      "{%- set content = m.content %}{%- endif %}{{- '<|im_start|>' + m.role + '\n' + content + "
      "'<|im_end|>\n' }}{%- endfor %}\n"
      "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\n' }}"
      "{%- if enable_thinking is defined and enable_thinking is false %}{{- '<think>\n\n</think>\n\n' }}"
      "{%- endif %}{%- endif %}\n",
      "{{ bos_token }}{% for message in messages %}{{ '<|start_header_id|>' + message['role'] + "
      "'<|end_header_id|>\n\n' + message['content'] | trim + '<|eot_id|>' }}{% endfor %}"
      "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}{% endif %}",
      "{% for message in messages %}{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
      "{{ raise_exception('Conversation roles must alternate user/assistant/user/assistant/...') }}"
      "{% endif %}{% if message['role'] == 'user' %}{{ bos_token + '[INST] ' + message['content'].strip() + "
      "' [/INST]' }}{% elif message['role'] == 'assistant' %}{{ ' ' + message['content'].strip() + ' ' + "
      "eos_token }}{% endif %}{% endfor %}",
      "<ul>\n  {% for m in messages if m.role != 'system' %}\n    <li>{{- loop.index }}: {{ m.content -}}</li>\n"
      "  {% else %}\n    none\n  {% endfor %}\n</ul>{# a comment #}\n  {%+ if true +%}\nkept{% endif %}\n",
      "{{ messages | selectattr('role', 'equalto', 'user') | map(attribute='content') | join(', ') }}|"
      "{{ {'a': [1, 2.5, none, true], 'b': messages[0]} | tojson(indent=2) }}|{% for k, v in "
      "{'x': 1, 'y': 2}.items() %}{{ k }}={{ v }}{% endfor %}|{{ messages is defined and 3 is odd "
      "and 'a' is string }}|{{ (messages | length) // 2 ** 2 }}|{{ strftime_now('%d %b %Y') }}",
      "{% set s = messages[-1].content %}{{ s[1:4] }}{{ s[::-1] }}{{ s.upper() }}{{ s.replace('a', 'b') }}"
      "{{ s.split() }}{{ s.startswith(('x', 'y')) }}{{ s | length }}{{ range(3) | list }}"
      "{% set block %}{{ s | capitalize }}{% endset %}{{ block ~ 1 }}{{ 'x' if s else 'y' }}",
      std::string("{{ messages[1].content | trim }}") + '\0' + "  a message with {{ jinja }} and {% tags %}  ",
  };
  for (size_t i = 0; i < templates.size(); ++i) {
    if (Status s = WriteBytes(dir / fmt::format("template{}.jinja", i), templates[i]); !s.ok()) return s;
  }
  return Status::Ok();
}

// Request bodies of kvq serve's two endpoints: every field it reads, valid and at its edges.
Status WriteOpenAiRequestSeeds(const fs::path& dir) {
  const std::vector<std::string> bodies = {
      R"({"model":"m","prompt":"Once upon a time","max_tokens":16,"temperature":0})",
      R"({"prompt":["one"],"max_tokens":1,"temperature":2,"top_p":1,"top_k":0,"min_p":0,"seed":-9223372036854775808,)"
      R"("stop":["
","END","a","b"],"stream":true,"stream_options":{"include_usage":true},"ignore_eos":true})",
      R"({"messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Hi é {{ x }}"}],)"
      R"("max_completion_tokens":4096,"chat_template_kwargs":{"enable_thinking":false}})",
      R"({"messages":[{"role":"user","content":[{"type":"text","text":"a"},{"type":"text","text":"b"}]},)"
      R"({"role":"assistant","content":null}],"n":1,"logprobs":false,"echo":false,"presence_penalty":0,"tools":[]})",
      R"({"prompt":"x","max_tokens":0,"temperature":-1,"top_p":0,"stop":[""],"n":2,"logprobs":3})",
      R"({"messages":[{"role":"user","content":[{"type":"image_url"}]}],"tools":[{"type":"function"}]})",
      std::string(R"({"prompt":"\ud800\udc00\u0000)") + "\xff" + R"(","max_tokens":1e30})",
  };
  for (size_t i = 0; i < bodies.size(); ++i) {
    if (Status s = WriteBytes(dir / fmt::format("request{}.json", i), bodies[i]); !s.ok()) return s;
  }
  return Status::Ok();
}

}  // namespace

Status WriteSeedCorpus(const std::string& dir, std::string_view only) {
  using Writer = Status (*)(const fs::path&);
  const std::pair<const char*, Writer> writers[] = {
      {"gguf", WriteGgufSeeds},           {"llama2c", WriteLlama2cSeeds},     {"snapshot", WriteSnapshotSeeds},
      {"tokenizer_spm", WriteTextSeeds}, {"tokenizer_bpe", WriteTextSeeds}, {"parsers", WriteParserSeeds},
      {"chat_template", WriteChatTemplateSeeds}, {"openai_request", WriteOpenAiRequestSeeds}};
  bool wrote = false;
  for (const auto& [target, writer] : writers) {
    if (!only.empty() && only != target) continue;
    const fs::path sub = fs::path(dir) / target;
    std::error_code ec;
    fs::create_directories(sub, ec);
    if (ec) return Status::Error(fmt::format("cannot create {}: {}", sub.string(), ec.message()));
    if (Status s = writer(sub); !s.ok()) return s;
    wrote = true;
  }
  if (!wrote) return Status::Error(fmt::format("no fuzz target is called {}", only));
  return Status::Ok();
}

}  // namespace kvq::fuzz
