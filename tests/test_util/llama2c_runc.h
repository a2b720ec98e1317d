// llama2.c for tests: writers of a checkpoint with deterministic random weights and of a
// tokenizer file (any vocabulary, e.g. characters without byte pieces), run.c's encode() written
// out as run.c has it, and run.c's greedy generation loop over a forward function.
#pragma once

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <utility>
#include <vector>

namespace kvq::test {

struct Llama2cShape {
  int32_t dim = 16;
  int32_t hidden_dim = 40;
  int32_t n_layers = 2;
  int32_t n_heads = 4;
  int32_t n_kv_heads = 2;
  int32_t vocab_size = 0;
  int32_t seq_len = 64;
};

/// Uniform floats in [lo, hi) from a 64-bit LCG: the same stream on every compiler and library
/// (std::uniform_real_distribution is not specified bit for bit).
class TestRandom {
 public:
  explicit TestRandom(uint64_t seed) : state_(seed * 2 + 1) {}
  float Uniform(float lo, float hi) {
    state_ = state_ * 6364136223846793005ull + 1442695040888963407ull;
    const float unit = static_cast<float>(state_ >> 40) / static_cast<float>(1 << 24);  // [0, 1)
    return lo + (hi - lo) * unit;
  }

 private:
  uint64_t state_;
};

/// A llama2.c checkpoint (run.c's layout, shared classifier): the 7-int header, then embedding,
/// attention norms, wq, wk, wv, wo, FFN norms, w1, w2, w3, final norm, and the two RoPE tables
/// (zeros: run.c and kvq compute RoPE themselves). Matrices are uniform in [-scale, scale), norm
/// weights in [0.5, 1.5).
inline void WriteLlama2cCheckpoint(const std::string& path, const Llama2cShape& s, uint64_t seed, float scale) {
  TestRandom rng(seed);
  const int64_t d = s.dim, hd = s.hidden_dim, L = s.n_layers, kv = s.dim / s.n_heads * s.n_kv_heads;
  const int64_t hs = s.dim / s.n_heads;
  std::vector<float> w;  // every float after the header, in file order
  const auto matrix = [&](int64_t n) {
    for (int64_t i = 0; i < n; ++i) w.push_back(rng.Uniform(-scale, scale));
  };
  const auto norm = [&](int64_t n) {
    for (int64_t i = 0; i < n; ++i) w.push_back(rng.Uniform(0.5f, 1.5f));
  };
  matrix(int64_t{s.vocab_size} * d);  // [vocab][dim]
  norm(L * d);                        // [layers][dim]
  matrix(L * d * d);                  // wq [layers][dim][dim]
  matrix(L * kv * d);                 // wk [layers][kv_dim][dim]
  matrix(L * kv * d);                 // wv [layers][kv_dim][dim]
  matrix(L * d * d);                  // wo [layers][dim][dim]
  norm(L * d);                        // [layers][dim]
  matrix(L * hd * d);                 // w1 [layers][hidden][dim]
  matrix(L * d * hd);                 // w2 [layers][dim][hidden]
  matrix(L * hd * d);                 // w3 [layers][hidden][dim]
  norm(d);                            // final norm [dim]
  w.resize(w.size() + s.seq_len * hs, 0.0f);  // freq_cis_real, freq_cis_imag [seq_len][hs / 2] each
  const int32_t header[7] = {s.dim, s.hidden_dim, s.n_layers, s.n_heads, s.n_kv_heads, s.vocab_size, s.seq_len};
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(header), sizeof(header));
  out.write(reinterpret_cast<const char*>(w.data()), static_cast<std::streamsize>(w.size() * sizeof(float)));
}

/// A llama2.c tokenizer file: int32 max_token_length, then per piece f32 score, int32 length,
/// bytes.
inline void WriteLlama2cTokenizer(const std::string& path, const std::vector<std::string>& pieces,
                                  const std::vector<float>& scores) {
  int32_t max_len = 0;
  for (const std::string& p : pieces) max_len = std::max(max_len, static_cast<int32_t>(p.size()));
  std::ofstream out(path, std::ios::binary);
  out.write(reinterpret_cast<const char*>(&max_len), 4);
  for (size_t i = 0; i < pieces.size(); ++i) {
    const int32_t len = static_cast<int32_t>(pieces[i].size());
    out.write(reinterpret_cast<const char*>(&scores[i]), 4);
    out.write(reinterpret_cast<const char*>(&len), 4);
    out.write(pieces[i].data(), len);
  }
}

/// run.c's encode(), statement for statement: BOS (1) if asked; the dummy prefix str_lookup(" ")
/// when the text is not empty; each UTF-8 character (up to 4 bytes) looked up, else each of its
/// bytes as id byte + 3; then, while some adjacent pair's concatenated pieces are a piece, the
/// best-scoring such pair (the first on ties, strict >, from -1e10) is merged. str_lookup is a
/// binary search of the sorted pieces; with distinct pieces a std::map finds the same id.
inline std::vector<int32_t> RunCEncode(const std::vector<std::string>& vocab, const std::vector<float>& scores,
                                       const std::string& text, bool bos) {
  std::map<std::string, int32_t> sorted;
  for (size_t i = 0; i < vocab.size(); ++i) sorted.emplace(vocab[i], static_cast<int32_t>(i));
  const auto lookup = [&](const std::string& s) {
    const auto it = sorted.find(s);
    return it == sorted.end() ? -1 : it->second;
  };
  std::vector<int32_t> tokens;
  if (bos) tokens.push_back(1);
  if (!text.empty()) tokens.push_back(lookup(" "));
  std::string buffer;
  for (size_t c = 0; c < text.size(); ++c) {
    if ((text[c] & 0xC0) != 0x80) buffer.clear();
    buffer.push_back(text[c]);
    const char next = c + 1 < text.size() ? text[c + 1] : '\0';
    if ((next & 0xC0) == 0x80 && buffer.size() < 4) continue;
    const int32_t id = lookup(buffer);
    if (id != -1) {
      tokens.push_back(id);
    } else {
      for (const char b : buffer) tokens.push_back(static_cast<unsigned char>(b) + 3);
    }
    buffer.clear();
  }
  while (true) {
    float best_score = -1e10f;
    int32_t best_id = -1;
    int64_t best_idx = -1;
    for (size_t i = 0; i + 1 < tokens.size(); ++i) {
      const int32_t id = lookup(vocab[tokens[i]] + vocab[tokens[i + 1]]);
      if (id != -1 && scores[id] > best_score) {
        best_score = scores[id];
        best_id = id;
        best_idx = static_cast<int64_t>(i);
      }
    }
    if (best_idx == -1) break;
    tokens[best_idx] = best_id;
    tokens.erase(tokens.begin() + best_idx + 1);
  }
  return tokens;
}

/// run.c's generate() with greedy sampling: positions 0..steps-1, the prompt forced, then the
/// argmax of `forward(token, pos)`'s logits; stops (without keeping it) at BOS, id 1. Returns the
/// prompt and the generated ids. `margins`, when given, receives for each generated id the gap
/// between its logit and the runner-up's.
inline std::vector<int32_t> RunCGreedy(const std::function<std::vector<float>(int32_t, int32_t)>& forward,
                                       const std::vector<int32_t>& prompt, int32_t steps,
                                       std::vector<float>* margins = nullptr) {
  std::vector<int32_t> out = prompt;
  int32_t token = prompt[0];
  for (int32_t pos = 0; pos < steps;) {
    const std::vector<float> logits = forward(token, pos);
    int32_t next = 0;
    if (pos < static_cast<int32_t>(prompt.size()) - 1) {
      next = prompt[pos + 1];
    } else {
      next = static_cast<int32_t>(std::max_element(logits.begin(), logits.end()) - logits.begin());
      if (margins) {
        float second = -1e30f;
        for (size_t i = 0; i < logits.size(); ++i) {
          if (static_cast<int32_t>(i) != next) second = std::max(second, logits[i]);
        }
        margins->push_back(logits[next] - second);
      }
    }
    ++pos;
    if (next == 1) break;
    if (pos > static_cast<int32_t>(prompt.size()) - 1) out.push_back(next);
    token = next;
  }
  return out;
}

/// A character-level vocabulary, as a SentencePiece model trained without byte fallback exports
/// it through llama2.c: <unk>, BOS, EOS, a space, a-z, six punctuation characters and a newline,
/// then a few merges (scores chosen so that merges compete, ties included); no byte pieces.
struct CharVocab {
  std::vector<std::string> pieces;
  std::vector<float> scores;
};
inline CharVocab CharacterVocab() {
  CharVocab v{{"<unk>", "\n<s>\n", "\n</s>\n"}, {0, 0, 0}};
  const auto add = [&](std::string piece, float score) {
    v.pieces.push_back(std::move(piece));
    v.scores.push_back(score);
  };
  add(" ", -100);
  for (char c = 'a'; c <= 'z'; ++c) add(std::string(1, c), -101.0f - static_cast<float>(c - 'a'));
  for (const char* c : {".", ",", "!", "?", "'", "\n"}) add(c, -130);
  // "an" and "nd" tie, and "er" and "re": the leftmost pair merges first (run.c's strict >, kvq's
  // queue order), so "were" is "w" "er" "e".
  const std::pair<const char*, float> merges[] = {{"th", -1},  {"he", -2},    {" t", -3},   {" the", -5},
                                                  {"the", -6}, {"an", -7},    {"nd", -7},   {"and", -7.5f},
                                                  {" a", -8},  {" and", -9},  {"in", -10},  {"er", -11},
                                                  {"re", -11}};
  for (const auto& [piece, score] : merges) add(piece, score);
  return v;
}

}  // namespace kvq::test
