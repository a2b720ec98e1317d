// An application of kvq's C++ API: load a model, generate greedily from a prompt, print the prompt
// and the completion as `kvq run` prints them (so the test can compare the two byte for byte),
// then check the step-by-step API gives the same tokens.
// Usage: consumer_cpp MODEL TOKENIZER PROMPT N_TOKENS KV_FORMAT
#include <cstdio>
#include <cstdlib>
#include <string>

#include "kvq/model.h"
#include "kvq/session.h"

int main(int argc, char** argv) {
  if (argc != 6) {
    std::fprintf(stderr, "usage: consumer_cpp MODEL TOKENIZER PROMPT N_TOKENS KV_FORMAT\n");
    return 2;
  }
  kvq::ModelOptions options{.tokenizer_path = argv[2], .threads = 1};
  options.kv.key_format = options.kv.value_format = argv[5];
  kvq::Result<std::unique_ptr<kvq::Model>> model = kvq::Model::Load(argv[1], options);
  if (!model.ok()) {
    std::fprintf(stderr, "consumer_cpp: %s\n", model.status().message().c_str());
    return 1;
  }
  kvq::Result<std::unique_ptr<kvq::Session>> session = (*model)->NewSession();
  if (!session.ok()) {
    std::fprintf(stderr, "consumer_cpp: %s\n", session.status().message().c_str());
    return 1;
  }
  const std::string prompt = argv[3];
  const kvq::GenerateRequest request{.max_tokens = std::atoi(argv[4]), .sampling = {.temperature = 0}};
  std::printf("%s", prompt.c_str());
  kvq::Result<kvq::Completion> c = (*session)->Generate(prompt, request, [](int32_t, const std::string& piece) {
    std::printf("%s", piece.c_str());
    return true;
  });
  if (!c.ok()) {
    std::fprintf(stderr, "consumer_cpp: %s\n", c.status().message().c_str());
    return 1;
  }
  std::printf("\n\n");

  // The same completion by hand: Prefill the prompt, then argmax and Decode.
  kvq::Result<std::unique_ptr<kvq::Session>> manual = (*model)->NewSession();
  if (!manual.ok() || !(*manual)->Prefill((*model)->Tokenize(prompt)).ok()) return 1;
  for (size_t i = 0; i < c->tokens.size(); ++i) {
    kvq::Result<int32_t> next = (*manual)->Sample();  // default sampler options differ: use argmax
    if (!next.ok()) return 1;
    const std::span<const float> logits = (*manual)->logits();
    int32_t best = 0;
    for (int32_t t = 1; t < static_cast<int32_t>(logits.size()); ++t) best = logits[t] > logits[best] ? t : best;
    if (best != c->tokens[i]) {
      std::fprintf(stderr, "consumer_cpp: step %zu: Decode loop chose %d, Generate %d\n", i, best, c->tokens[i]);
      return 1;
    }
    if (i + 1 < c->tokens.size() && !(*manual)->Decode(best).ok()) return 1;
  }
  std::fprintf(stderr, "consumer_cpp: %zu tokens, KV cache %lld bytes\n", c->tokens.size(),
               static_cast<long long>((*session)->kv_bytes()));
  return 0;
}
