/* An application of kvq's C API: load a model, generate greedily, print the prompt and the
 * completion as `kvq run` prints them. Usage: consumer_c MODEL TOKENIZER PROMPT N_TOKENS KV_FORMAT */
#include <stdio.h>
#include <stdlib.h>

#include "kvq.h"

static int print_piece(int32_t token, const char* piece, void* user_data) {
  (void)token;
  ++*(int*)user_data;
  fputs(piece, stdout);
  return 1;
}

int main(int argc, char** argv) {
  if (argc != 6) {
    fprintf(stderr, "usage: consumer_c MODEL TOKENIZER PROMPT N_TOKENS KV_FORMAT\n");
    return 2;
  }
  kvq_model_options mo;
  kvq_model_options_init(&mo);
  mo.tokenizer_path = argv[2];
  mo.threads = 1;
  mo.kv_key_format = argv[5];
  mo.kv_value_format = argv[5];
  kvq_model* model = kvq_model_load(argv[1], &mo);
  if (model == NULL) {
    fprintf(stderr, "consumer_c: %s\n", kvq_last_error());
    return 1;
  }
  kvq_model_info info;
  kvq_model_info_init(&info);
  if (kvq_model_get_info(model, &info) != KVQ_OK) {
    fprintf(stderr, "consumer_c: %s\n", kvq_last_error());
    kvq_model_free(model);
    return 1;
  }
  kvq_session* session = kvq_session_new(model, NULL);
  if (session == NULL) {
    fprintf(stderr, "consumer_c: %s\n", kvq_last_error());
    kvq_model_free(model);
    return 1;
  }
  kvq_generate_options go;
  kvq_generate_options_init(&go);
  go.max_tokens = atoi(argv[4]);
  go.temperature = 0;
  int pieces = 0;
  int64_t generated = 0;
  fputs(argv[3], stdout);
  const int rc = kvq_session_generate(session, argv[3], &go, print_piece, &pieces, &generated);
  fputs("\n\n", stdout);
  if (rc != KVQ_OK || generated != pieces) {
    fprintf(stderr, "consumer_c: %s (%lld generated, %d pieces)\n", kvq_last_error(), (long long)generated, pieces);
  }
  /* A bad format is an error with a message, not a crash. */
  kvq_model_options bad = mo;
  bad.kv_key_format = "int3";
  kvq_session* refused = kvq_session_new(model, &bad);
  const int refused_ok = refused == NULL && kvq_last_error()[0] != '\0';
  fprintf(stderr, "consumer_c: %s: %lld tokens, %d layers; bad format: %s\n", info.architecture,
          (long long)generated, info.n_layers, kvq_last_error());
  kvq_session_free(refused);
  kvq_session_free(session);
  kvq_model_free(model);
  return rc == KVQ_OK && generated == pieces && refused_ok ? 0 : 1;
}
